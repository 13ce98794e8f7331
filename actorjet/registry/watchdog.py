"""Liveness, not only aliveness: find a child that is alive but makes no progress.

A process that answers pings can still be stuck (a batcher thread asleep in a dead lock, a
learner blocked on I/O), and a swarm that hangs without a word is worse than one that
crashes.  Engines report their batch counter and how many requests wait; the learner's
progress is its step, and its work is the finished groups it has not trained.  Work waiting
and no progress for ``stall_s`` → the child is named in status (``stalled``), logged, and
crashed on purpose so its supervisor restarts it; when a new incarnation reports, the stall
counts as healed.  An engine or gateway that stops reporting at all for ``stall_s`` is stalled
too, work or not: it is hung, or dead without its supervisor having been told (the registry
then also asks that supervisor to restart it: runtime/messages.py RestartStalled).

A learner's batches come through its model's engine and gateway (rollouts, then the
gateway's writes to the episode store), so while either of those is stalled the learner
is starved, not stuck: it is not blamed, and its quiet time starts again when they heal.
(Found in CI: a blocked gateway also got an innocent learner restarted, which costs a
rewind to its last checkpoint.)

Plain state, no thespian: ``progress`` takes a report, ``check`` returns who to crash.
"""
from __future__ import annotations

from dataclasses import dataclass

UPSTREAM = {"learner": ("engine", "gateway")}     # kind → the kinds of the same model it waits on
SELF_REPORTING = ("engine", "gateway")             # report every second (the learner's steps are reported for it)
# (an engine replica reports as "engine.K": any stalled replica counts as its model's engine)


def _kind_of(who: str, model: str) -> str | None:
    """"policy/engine.1" → "engine" for model "policy" (None for another model's child)."""
    owner, _, kind = who.rpartition("/")
    return kind.split(".")[0] if owner == model else None


@dataclass
class _Seen:
    count: int
    since: float            # when ``count`` last changed (or the work started waiting)
    waiting: int
    address: object
    heard: float            # its last report


class Watchdog:
    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self.seen: dict[str, _Seen] = {}         # "model/kind" → last report
        self.stalled: dict[str, float] = {}      # "model/kind" → when it was found stalled
        self.detected = self.healed = 0

    def progress(self, who: str, count: int, waiting: int, address, now: float) -> None:
        last = self.seen.get(who)
        if last is None or last.address != address:
            if who in self.stalled:                  # a new incarnation reports: healed
                del self.stalled[who]
                self.healed += 1
            self.seen[who] = _Seen(count, now, waiting, address, now)
            return
        last.heard = now
        if count != last.count or (waiting and not last.waiting):
            last.count, last.since, last.waiting = count, now, waiting
        else:
            last.waiting = waiting

    def forget(self, who: str) -> None:
        self.seen.pop(who, None)

    def check(self, now: float) -> list[tuple[str, object, str]]:
        """(who, address, reason) of every child newly found stalled.  Upstream children are
        judged first, so a learner starved by them in the same moment is not blamed."""
        out = []
        order = sorted(self.seen, key=lambda who: who.rpartition("/")[2] in UPSTREAM)
        for who in order:
            s = self.seen[who]
            model, _, kind = who.rpartition("/")
            if any(_kind_of(w, model) in UPSTREAM.get(kind, ()) for w in self.stalled):
                s.since = now                  # starved by a stalled engine or gateway: not its fault
                continue
            quiet = now - s.since
            silent = (now - s.heard) if _kind_of(who, model) in SELF_REPORTING else 0.0
            if who in self.stalled or not ((s.waiting and quiet > self.stall_s) or silent > self.stall_s):
                continue
            self.stalled[who] = now
            self.detected += 1
            out.append((who, s.address, f"stalled: no report for {silent:.0f} s" if silent > self.stall_s
                        else f"stalled: no progress for {quiet:.0f} s with {s.waiting} waiting"))
        return out

    def status(self, now: float) -> dict:
        return {"stalled": {who: round(now - self.seen[who].since) for who in self.stalled if who in self.seen},
                "stalls_detected": self.detected, "stalls_healed": self.healed, "stall_s": self.stall_s}
