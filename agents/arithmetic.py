"""2-digit addition: the quickstart's task source and agent behavior.

A task source is a module with ``tasks(seed)`` (an endless iterator of task dicts),
optionally ``eval_tasks()`` plus ``messages(task)`` and ``score(task, text)`` for held-out
evaluation, and a behavior ``behavior(task, llm) -> reward``.  The behavior is ordinary
agent code: it talks to the model through the ``openai`` SDK.
"""
from __future__ import annotations

import random
from typing import Iterator


def _problem(rng: random.Random) -> dict:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return {"question": f"{a:02d}+{b:02d}=", "answer": str(a + b)}


def eval_tasks(n: int = 512) -> list[dict]:
    rng = random.Random(12345)
    return [_problem(rng) for _ in range(n)]


def tasks(seed: int = 0) -> Iterator[dict]:
    """Training problems, never one of the held-out ones."""
    held_out = {t["question"] for t in eval_tasks()}
    rng = random.Random(seed)
    while True:
        task = _problem(rng)
        if task["question"] not in held_out:
            yield task


def messages(task: dict) -> list[dict]:
    return [{"role": "user", "content": task["question"]}]


def score(task: dict, text: str) -> float:
    return 1.0 if text.strip() == task["answer"] else 0.0


def behavior(task: dict, llm) -> float:
    client = llm.client()
    reply = client.chat.completions.create(model=llm.model(), messages=messages(task),
                                           max_tokens=4, temperature=1.0)
    return score(task, reply.choices[0].message.content or "")
