"""RUN_DIR/groups.jsonl on the head: which code produced which complete group, for good.

One line per group the episode stores judged complete (store/completed.py: group_id,
task_name, behavior, version, rewards, and ``t`` when the head heard it), appended as the
gateways tell the registry (``StoreNews``).  A group of a task that calls several models is
complete in each of their stores, and each gateway tells it: the line is written once (the
ids heard lately are remembered; the stores tell a group within seconds of each other).
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict
from pathlib import Path

from actorjet import disk

REMEMBER = 100_000     # group ids kept to write each line once (~10 MB at most)


class GroupLog:
    def __init__(self, run_dir: str | Path | None):
        self.path = Path(run_dir) / "groups.jsonl" if run_dir else None
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.cause = ""        # why the last lines could not be written (a full disk), or ""

    def add(self, groups: list) -> list[str]:
        """Append the groups not written yet; returns the ids of all it has (written now or before).
        On a full disk the new ones are not returned: their gateway tells them again."""
        new, ids = [], []
        for g in groups:
            if not isinstance(g, dict) or not isinstance(g.get("group_id"), str):
                continue
            ids.append(g["group_id"])
            if g["group_id"] not in self.seen:
                self.seen[g["group_id"]] = None
                new.append(g)
        while len(self.seen) > REMEMBER:
            self.seen.popitem(last=False)
        if new and self.path is not None:
            now = round(time.time(), 3)
            try:
                disk.append_whole(self.path, "".join(json.dumps(dict(g, t=now)) + "\n" for g in new).encode())
            except OSError as e:
                if not disk.is_full(e):
                    raise
                self.cause = disk.describe(e, self.path)
                for g in new:
                    self.seen.pop(g["group_id"], None)
                return [i for i in ids if i in self.seen]
        self.cause = ""
        return ids
