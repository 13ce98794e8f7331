"""The arithmetic agent in a messy environment: for chaos tests and `bench/chaos.py`.

Real agent environments crash, hang and leak.  This behavior does each at a small,
configurable rate (environment variables, read on the runner), around the ordinary
arithmetic episode, so ActorJet's fault handling can be exercised in a real training run:

    AJ_FLAKY_RAISE   probability that the episode raises            (default 0.05)
    AJ_FLAKY_HANG    probability that it hangs for AJ_FLAKY_HANG_S s (default 0.02, 30 s)
    AJ_FLAKY_EXIT    probability that it kills its runner process    (default 0.0)
    AJ_FLAKY_LEAK_MB megabytes it leaks per episode                  (default 0)

As a task source (``source = "agents.flaky_arithmetic"``) it is the arithmetic task with a
held-out evaluation of 8 problems that takes AJ_FLAKY_EVAL_S seconds (default 0): the slow
multi-turn evaluation of a real model, in a second.
"""
from __future__ import annotations

import os
import random
import time

from actorjet_agents import arithmetic as plain


_LEAKED: list = []


def _rate(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def behavior(task: dict, llm) -> float:
    """One roll picks at most one fault; a hang is followed by the ordinary episode."""
    raise_p, hang_p, exit_p = _rate("AJ_FLAKY_RAISE", 0.05), _rate("AJ_FLAKY_HANG", 0.02), _rate("AJ_FLAKY_EXIT", 0.0)
    roll = random.random()
    if roll < raise_p:
        raise ConnectionError("environment crashed (injected)")
    elif roll < raise_p + hang_p:
        time.sleep(_rate("AJ_FLAKY_HANG_S", 30.0))
    elif roll < raise_p + hang_p + exit_p:
        os._exit(17)
    if _rate("AJ_FLAKY_LEAK_MB", 0.0):
        _LEAKED.append(b"\x01" * int(_rate("AJ_FLAKY_LEAK_MB", 0.0) * 2**20))   # touched: resident
    return plain.behavior(task, llm)


tasks = plain.tasks       # as a task source: the arithmetic problems


def eval_tasks(split: str = "validation") -> list[dict]:
    return plain.eval_tasks(split)[:8]


def eval_episode(task: dict, chat) -> float:
    time.sleep(_rate("AJ_FLAKY_EVAL_S", 0.0))
    return plain.score(task, chat(plain.messages(task), None, 8)["content"] or "")
