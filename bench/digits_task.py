"""A task whose reward varies for any model (share of digits in a short reply), so GRPO
groups carry signal and the overhead benchmark times real training steps on SmolLM2."""
from __future__ import annotations

import random

MAX_TOKENS = 8


def tasks(seed: int = 0):
    rng = random.Random(seed)
    while True:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield {"question": f"{a:02d}+{b:02d}="}


def messages(task: dict) -> list[dict]:
    return [{"role": "user", "content": task["question"]}]


def score(task: dict, text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def behavior(task: dict, llm) -> float:
    reply = llm.client().chat.completions.create(model=llm.model(), messages=messages(task),
                                                 max_tokens=MAX_TOKENS, temperature=1.0)
    return score(task, reply.choices[0].message.content or "")
