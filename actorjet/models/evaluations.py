"""A learner's held-out evaluations: scored on a copy of the weights in a thread of their own.

A multi-turn evaluation of a real model takes minutes; run inline it stopped training, and
the watchdog took the quiet learner for a stuck one.  So ``start`` copies the weights and
queues the scoring (one thread: evaluations finish in step order), and the learner collects
the lines of finished ones (``finished``) on its next wakeups.  At most two are pending (one
scoring, one waiting): more would pile up weight copies, so a third is skipped, unless it is
the last, which the registry waits for to call training finished.
"""
from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor

from actorjet.models.evaluate import greedy_accuracy

MAX_PENDING = 2


class Evaluations:
    def __init__(self, model_name: str, specs: list[tuple[str, tuple]], tokenizer, cfg: dict):
        """``specs``: (task, held-out spec) per task that has an eval set (models/heldout.py)."""
        self.model_name, self.specs, self.cfg = model_name, specs, cfg
        self.tokenizer = copy.deepcopy(tokenizer)       # a fast tokenizer is not for two threads
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"eval.{model_name}")
        self.running: list[Future] = []

    def start(self, model, step: int, version: int, last: bool = False) -> bool:
        """Queue an evaluation of ``model`` as it is now; False if skipped (two pending)."""
        if not self.specs or (len(self.running) >= MAX_PENDING and not last):
            return False
        self.running.append(self.pool.submit(self._score, copy.deepcopy(model), step, version))
        return True

    def finished(self) -> list[list[dict]]:
        """The metrics lines of the evaluations done since last asked, oldest first (one that
        failed raises here, in the actor: the learner restarts, as when evaluation was inline)."""
        done = []
        while self.running and self.running[0].done():
            done.append(self.running.pop(0).result())
        return done

    def _score(self, model, step: int, version: int) -> list[dict]:
        """In the eval thread: one metrics line per task."""
        records = []
        for task, spec in self.specs:
            t0 = time.perf_counter()
            acc = greedy_accuracy(model, self.tokenizer, spec, self.cfg["eval_max_tokens"],
                                  limit=self.cfg.get("eval_limit") or None, tool_parser=self.cfg.get("tool_parser", ""))
            records.append({"kind": "eval", "model": self.model_name, "task": task, "split": self.cfg["eval_split"],
                            "step": step, "weight_version": version, "accuracy": acc,
                            "eval_time_s": time.perf_counter() - t0})
        return records

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
