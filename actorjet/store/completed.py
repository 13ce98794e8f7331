"""What the store judged: the groups that became complete, told to the head once.

The episode store is the one judge of a group: complete when every member's reward is stored
(store/episode_store.py), whoever ran the episodes — a runner's lease or a client program.
The registry does not keep rewards or decide completeness; it leases episodes and re-leases
failed ones.  So what the head shows about finished groups comes from here: the gateway that
writes the store reads, once a second, the complete groups it has not told yet (``news``)
and the number the learner has not trained (``untrained``), and sends both to the registry
(``StoreNews``), which appends the groups to RUN_DIR/groups.jsonl (which code produced which
rewards, for good), feeds the learner's watchdog the backlog, and answers with the ids it
wrote down (``GroupsLogged``): only then are they marked ``told``.  Until then they are told
again each second — a gateway or a message lost between the two costs a repeat, which the
registry writes once, never a line.  Retention keeps a group until it was told
(store/upkeep.py).  With several models a group is complete in each of their stores: the
registry writes its line once.
"""
from __future__ import annotations

import json
import time

NEWS_LIMIT = 1000      # groups per message (a backlog after a restart is told over a few seconds)


def news(store, limit: int = NEWS_LIMIT) -> list[dict]:
    """The complete groups not told yet, oldest first, each with one reward per member."""
    with store.lock:
        db = store.db
        rows = db.execute("SELECT group_id, task_name, behavior, version FROM groups WHERE logged IS NULL "
                          "AND complete_at IS NOT NULL ORDER BY complete_at LIMIT ?", (limit,)).fetchall()
        return [{"group_id": group_id, "task_name": task, "behavior": behavior, "version": version,
                 "rewards": group_rewards(db, group_id)} for group_id, task, behavior, version in rows]


def group_rewards(db, group_id: str) -> dict:
    """episode id → reward, one episode per member (a late twin is left out), oldest first:
    what the learner takes (EpisodeStore.take) and what the head is told."""
    rewards, seen = {}, set()
    for episode_id, member, reward in db.execute(
            "SELECT episode_id, member, reward FROM episodes WHERE group_id = ? AND reward IS NOT NULL "
            "ORDER BY stored_at", (group_id,)):
        if member not in seen:
            seen.add(member)
            rewards[episode_id] = json.loads(reward)
    return rewards


def told(store, group_ids: list[str]) -> None:
    """The head wrote these groups down: not told again, and retention may take them."""
    now = time.time()
    with store._tx() as db:
        db.executemany("UPDATE groups SET logged = ? WHERE group_id = ?", [(now, g) for g in group_ids])


def standing(store) -> tuple[int, int]:
    """(complete, untrained): every group the store ever judged complete (retired ones
    included) — the only count of finished groups there is (``groups.finished`` in status) —
    and those neither trained nor quarantined (taken for a step or still pending): the
    learner's work; the watchdog blames a learner that makes no step while it is there."""
    with store.lock:
        complete, untrained = store.db.execute(
            "SELECT COUNT(*), COUNT(*) - COUNT(trained_step) - COUNT(quarantine) FROM groups "
            "WHERE complete_at IS NOT NULL").fetchone()
        retired = store.db.execute("SELECT COALESCE(MAX(groups), 0) FROM retired").fetchone()[0]
    return complete + retired, untrained
