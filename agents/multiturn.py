"""A 3-turn arithmetic agent: each turn asks to add a small number to the previous answer.

A multi-turn example for docs, tests and the context-tracker benchmark: every call's
prompt is the whole conversation so far, which is what timeline merging exploits.
"""
from __future__ import annotations

import random
from typing import Iterator


def tasks(seed: int = 0) -> Iterator[dict]:
    rng = random.Random(seed)
    while True:
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        yield {"question": f"{a:02d}+{b:02d}=", "start": a + b, "steps": [rng.randint(1, 9) for _ in range(2)]}


def behavior(task: dict, llm) -> float:
    client = llm.client(role="solver")
    history = [{"role": "user", "content": task["question"]}]
    expected, correct = task["start"], 0.0
    for turn in range(3):
        reply = client.chat.completions.create(model=llm.model(), messages=history, max_tokens=4, temperature=1.0)
        answer = (reply.choices[0].message.content or "").strip()
        correct += answer == str(expected)
        if turn < 2:
            step = task["steps"][turn]
            history += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"+{step}="}]
            expected += step
    return correct / 3
