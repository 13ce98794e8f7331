"""Throughput work for a random-init model: a fixed-length answer to a random prompt.

bench/rl_throughput.py measures how many samples a second a framework generates and trains
on a model of a real shape (random weights: no weights can travel to a lent GPU machine).
What the answers say does not matter, but GRPO needs rewards that differ within a group:
the reward is the share of digits in the answer's text, which varies from sample to sample.
The answer length comes with the task (``max_tokens``), so every framework samples as many
tokens.
"""
from __future__ import annotations

import os
import random
from typing import Iterator

ANSWER_TOKENS = 256


def tasks(seed: int = 0, max_tokens: int | None = None) -> Iterator[dict]:
    """Endless random prompts; ``max_tokens``: the answers' length (ACTORJET_NOISE_TOKENS, which
    the bench sets for the runners it starts, or 256)."""
    max_tokens = max_tokens or int(os.environ.get("ACTORJET_NOISE_TOKENS", ANSWER_TOKENS))
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789 "
    while True:
        yield {"prompt": "".join(rng.choice(letters) for _ in range(48)), "max_tokens": max_tokens}


def messages(task: dict) -> list[dict]:
    return [{"role": "user", "content": task["prompt"]}]


def score(task: dict, text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def behavior(task: dict, llm) -> float:
    client = llm.client()
    reply = client.chat.completions.create(model=llm.model(), messages=messages(task),
                                           max_tokens=task["max_tokens"], temperature=1.0)
    return score(task, reply.choices[0].message.content or "")
