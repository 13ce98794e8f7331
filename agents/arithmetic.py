"""2-digit addition: the quickstart's task source and agent behavior.

A task source is a module with ``tasks(seed)`` (an endless iterator of task dicts),
optionally ``eval_tasks(split)`` plus ``messages(task)`` and ``score(task, text)`` for held-out
evaluation, and a behavior ``behavior(task, llm) -> reward``.  The behavior is ordinary
agent code: it talks to the model through the ``openai`` SDK.
"""
from __future__ import annotations

import random
from typing import Iterator


def _problem(rng: random.Random) -> dict:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return {"question": f"{a:02d}+{b:02d}=", "answer": str(a + b)}


SPLIT_SEEDS = {"validation": 12345, "test": 67890}


def eval_tasks(split: str = "validation", n: int = 512) -> list[dict]:
    """Held-out problems.  ``validation`` is what training runs report and what a study selects
    on; ``test`` is a disjoint set a study's final comparison uses (actorjet research)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLIT_SEEDS)})")
    rng = random.Random(SPLIT_SEEDS[split])
    if split == "validation":      # drawn as it always was (a few repeats), so past figures still compare
        return [_problem(rng) for _ in range(n)]
    taken, out = {t["question"] for t in eval_tasks("validation", n)}, []
    while len(out) < n:
        task = _problem(rng)
        if task["question"] not in taken:
            taken.add(task["question"])
            out.append(task)
    return out


def tasks(seed: int = 0) -> Iterator[dict]:
    """Training problems, never one of the held-out ones (of either split)."""
    held_out = {t["question"] for split in SPLIT_SEEDS for t in eval_tasks(split)}
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
