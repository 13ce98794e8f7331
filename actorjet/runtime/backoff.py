"""One crash-loop policy for every restart in ActorJet: supervised actors, dynamic children
(runners) and a task's worker process.

A child that ran for at least ``healthy_s`` before it died is restarted at once: fast
recovery matters most, and one crash says little.  One that keeps dying within ``healthy_s``
of its start is in a crash loop; its k-th quick death in a row waits ``initial_s * 2**(k-1)``,
capped at ``max_s``, so a loop cannot take the CPU that everything else needs.
"""
from __future__ import annotations


class Backoff:
    def __init__(self, initial_s: float = 0.05, max_s: float = 5.0, healthy_s: float = 1.0):
        self.initial_s, self.max_s, self.healthy_s = initial_s, max_s, healthy_s
        self.quick_deaths: dict[str, int] = {}

    def delay(self, key: str, started_at: float, now: float) -> float:
        """Seconds to wait before restarting ``key``, which started at ``started_at`` and died at
        ``now`` (both ``time.monotonic()``)."""
        if now - started_at >= self.healthy_s:
            self.quick_deaths[key] = 0
            return 0.0
        k = self.quick_deaths[key] = self.quick_deaths.get(key, 0) + 1
        return min(self.max_s, self.initial_s * 2 ** (k - 1))
