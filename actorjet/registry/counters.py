"""Every count the registry reports (``actorjet status``, the metrics' ``swarm`` lines): one
object, so each count has one name, one place, and one way to change it."""
from __future__ import annotations

from dataclasses import dataclass, field


def bump(table: dict, key: str, n: int = 1) -> None:
    table[key] = table.get(key, 0) + n


@dataclass
class Counters:
    # episodes
    completed: int = 0
    aborted: int = 0
    in_flight: int = 0
    requeued: int = 0
    late_results: int = 0
    # groups
    groups_issued: int = 0                # (no count of finished groups: only the episode stores
    groups_dropped: int = 0               # judge that, StoreNews; tests/test_desks.py guards it)
    groups_quarantined: int = 0
    # why, and where
    abort_causes: dict[str, int] = field(default_factory=dict)
    drop_causes: dict[str, int] = field(default_factory=dict)
    quarantine_causes: dict[str, int] = field(default_factory=dict)
    abort_by_task: dict[str, dict[str, int]] = field(default_factory=dict)
    dropped_by_task: dict[str, int] = field(default_factory=dict)
    completed_by_task: dict[str, int] = field(default_factory=dict)
    completed_by_runner: dict[str, int] = field(default_factory=dict)

    def issue(self) -> None:
        """A new group was issued (a runner's lease, or a client program's first episode)."""
        self.groups_issued += 1

    def lease(self, n: int) -> None:
        """``n`` episodes went out in a lease."""
        self.in_flight += n

    def back(self, n: int) -> None:
        """``n`` episodes of a lease came back (a result, an expiry, a lost runner, a drop)."""
        self.in_flight -= n

    def requeue(self, n: int) -> None:
        """``n`` failed members will run again."""
        self.requeued += n

    def ran(self, runner: str, n: int) -> None:
        """``runner`` reported ``n`` episodes of a lease done."""
        bump(self.completed_by_runner, runner, n)

    def late(self) -> None:
        """A result came for a lease that is gone (expired, or its runner declared dead)."""
        self.late_results += 1

    def abort(self, cause: str, n: int = 1, task: str | None = None) -> None:
        """``n`` episodes failed; ``cause`` is their counter (the part before the first ':')."""
        key = cause.split(":")[0]
        self.aborted += n
        bump(self.abort_causes, key, n)
        if task is not None:
            bump(self.abort_by_task.setdefault(task, {}), key, n)

    def drop(self, task: str, cause: str) -> None:
        self.groups_dropped += 1
        bump(self.dropped_by_task, task)
        bump(self.drop_causes, cause.split(":")[0])

    def complete(self, task: str, n: int) -> None:
        self.completed += n
        bump(self.completed_by_task, task, n)

    def quarantine(self, cause: str) -> None:
        self.groups_quarantined += 1
        bump(self.quarantine_causes, cause.split(":")[0][:80])

    def episodes(self) -> dict[str, int]:
        return {"completed": self.completed, "aborted": self.aborted, "in_flight": self.in_flight,
                "requeued": self.requeued}
