"""Groups the learner could not train, on their way into quarantine.

The learner quarantines a batch the loss refused (bad data, never retried), which is a write
to the episode store.  On a full disk that write failed and crashed the learner, which then
rewound to its checkpoint (found by the disk-full test, issue 34).  Now the groups wait here,
the learner pauses like any writer on a full disk (actorjet/disk.py), and they are written,
in order and each once, when there is room.
"""
from __future__ import annotations

from actorjet import disk


class QuarantineQueue:
    def __init__(self, store):
        self.store = store
        self.waiting: list[tuple[str, str]] = []      # (group id, cause), oldest first
        self.cause = ""                                # why they wait ("" when none does)

    def add(self, group_ids: list[str], cause: str) -> None:
        self.waiting += [(group_id, cause) for group_id in group_ids]

    def flush(self) -> list[tuple[str, str]]:
        """Write what waits; returns the (group id, cause) pairs quarantined now.  Any error
        but a full disk is raised: it is the learner's failure, not the disk's."""
        done = []
        while self.waiting:
            group_id, cause = self.waiting[0]
            try:
                self.store.quarantine(group_id, cause)
            except Exception as e:
                if not disk.is_full(e):
                    raise
                self.cause = f"{len(self.waiting)} untrainable groups wait to be quarantined: {disk.describe(e)}"
                return done
            done.append(self.waiting.pop(0))
        self.cause = ""
        return done
