"""The episode store's upkeep: retention and format migration (store/episode_store.py).

Kept apart from the store's everyday API because they run rarely and touch every table:
``retain`` after each learner checkpoint; ``migrate`` (calls kept as JSON records) and
``add_columns`` (columns added since) once when an older store is opened.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from actorjet.runtime.logs import log
from actorjet.store import records as records_mod
from actorjet.store.episode_store import COLUMNS, FORMAT, SCHEMA, _Transaction


def retain(store, step: int, archive: Path | None = None, keep_closed_s: float = 7200.0) -> dict[str, int]:
    """Retention: the groups trained at or before ``step`` (the newest checkpoint's: a
    restarted learner rewinds to it and never needs them) leave the store — calls, rewards
    and group rows — and are only counted (``retired``); with ``archive``, each of their
    episodes is first appended to that JSONL file (compact: store/trajectories.py reads
    it).  Freed pages go back to the file system (incremental vacuum), so the store's size
    follows what is pending, not the length of the run.  Refused keys are remembered for
    ``keep_closed_s`` (longer than any episode may run); calls under a key nobody knows any
    more (a forgotten closed key used again) are deleted after that long too.  A group the
    gateway has not yet told the head about (store/completed.py) waits for the next time."""
    forget_closed(store, keep_closed_s)
    with store._tx() as db:
        groups = db.execute("SELECT group_id, task_name, behavior, version, trained_step FROM groups "
                            "WHERE trained_step IS NOT NULL AND trained_step <= ? AND quarantine IS NULL "
                            "AND logged IS NOT NULL",      # (its line in groups.jsonl first)
                            (step,)).fetchall()
        if not groups:
            return {"groups": 0, "episodes": 0}
        ids = [g[0] for g in groups]
        episodes = 0
        lines = []
        for group_id, task, behavior, version, trained in groups:
            members = db.execute("SELECT episode_id, reward, member FROM episodes WHERE group_id = ? "
                                 "AND reward IS NOT NULL", (group_id,)).fetchall()
            episodes += len({member for _, _, member in members})
            if archive is not None:
                for episode_id, reward, member in members:
                    calls = store._compact([episode_id], db)[episode_id]
                    lines.append(json.dumps({
                        "episode_id": episode_id, "group_id": group_id, "member": member, "task_name": task,
                        "behavior": behavior,
                        "version": version, "reward": json.loads(reward), "trained_step": trained,
                        "calls": [records_mod.portable(c) for c in calls]}))
        if lines:                                 # before the delete commits: at worst written twice
            append_lines(Path(archive), "\n".join(lines) + "\n")
        marks = ",".join("?" * len(ids))
        db.execute(f"DELETE FROM calls WHERE episode_id IN (SELECT episode_id FROM episodes "
                   f"WHERE group_id IN ({marks}))", ids)
        db.execute(f"DELETE FROM episodes WHERE group_id IN ({marks})", ids)
        db.execute(f"DELETE FROM groups WHERE group_id IN ({marks})", ids)
        db.execute("INSERT INTO retired VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                   "groups = groups + excluded.groups, episodes = episodes + excluded.episodes",
                   (len(ids), episodes))
    with store.lock:      # (a pragma that returns rows runs only as far as they are read)
        store.db.execute("PRAGMA incremental_vacuum").fetchall()
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()     # best effort: readers may hold it
    log.info("%s: retention at step %d: %d groups (%d episodes) left the episode store%s", Path(str(store.path)).name, step,
             len(ids), episodes, f", appended to {archive}" if archive else "")
    return {"groups": len(ids), "episodes": episodes}


def append_lines(path: Path, text: str) -> None:
    """Append whole lines to a JSONL file.  A process killed while appending leaves a torn last
    line (its groups were not deleted: the delete commits after the write, so they are written
    again next time); it is cut off first, so the file stays one JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        end = f.seek(0, 2)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                start = end
                while start > 0:                    # back to the last newline, a chunk at a time
                    step = min(start, 1 << 20)
                    f.seek(start - step)
                    found = f.read(step).rfind(b"\n")
                    if found >= 0:
                        start = start - step + found + 1
                        break
                    start -= step
                f.truncate(start)
        f.write(text.encode())
        f.flush()


def forget_closed(store, keep_s: float) -> None:
    old = time.time() - keep_s
    with store._tx() as db:
        db.execute("DELETE FROM closed WHERE closed_at IS NOT NULL AND closed_at < ?", (old,))
        db.execute("DELETE FROM calls WHERE episode_id NOT IN (SELECT episode_id FROM episodes) "
                   "AND json_extract(meta, '$.created') < ?", (old,))


def add_columns(db) -> None:
    """The columns added to the store's tables since it was first written, each filled as a
    store of that time would have it (a table not created yet gets them from SCHEMA)."""
    groups = [r[1] for r in db.execute("PRAGMA table_info(groups)")]
    if groups and "logged" not in groups:      # from before the stores judged groups: all told
        db.execute("ALTER TABLE groups ADD COLUMN logged REAL")
        db.execute("UPDATE groups SET logged = 0 WHERE complete_at IS NOT NULL")
    if groups and "taken_at" not in groups:    # from before the step timeline
        db.execute("ALTER TABLE groups ADD COLUMN taken_at REAL")
    if groups and "members" not in groups:     # from before counts() read them from the groups
        db.execute("ALTER TABLE groups ADD COLUMN members INTEGER")
        db.execute("UPDATE groups SET members = (SELECT COUNT(DISTINCT member) FROM episodes e "
                   "WHERE e.group_id = groups.group_id AND e.reward IS NOT NULL)")
    episodes = [r[1] for r in db.execute("PRAGMA table_info(episodes)")]
    if episodes and "times" not in episodes:
        db.execute("ALTER TABLE episodes ADD COLUMN times TEXT")
    closed = [r[1] for r in db.execute("PRAGMA table_info(closed)")]
    if closed and "cause" not in closed:
        db.execute("ALTER TABLE closed ADD COLUMN cause TEXT")
        db.execute("ALTER TABLE closed ADD COLUMN closed_at REAL")


def migrate(store) -> None:
    t0 = time.time()
    with _Transaction(store.db, store.lock) as db:
        db.execute("ALTER TABLE calls RENAME TO calls_v1")
        for statement in SCHEMA.split(";"):      # executescript would commit
            if statement.strip():
                db.execute(statement)
        tails, rows, n = records_mod.Tails(), [], 0
        for episode_id, record in db.execute("SELECT episode_id, record FROM calls_v1 "
                                             "ORDER BY episode_id, call_index, choice"):
            fields = {k: v for k, v in json.loads(record).items() if k in records_mod.CallRecord.__dataclass_fields__}
            rows.append(records_mod.encode(records_mod.CallRecord(**fields), tails))
            n += 1
            if len(rows) >= 1000:
                db.executemany(f"INSERT OR REPLACE INTO calls VALUES ({','.join('?' * len(COLUMNS))})", rows)
                rows = []
        db.executemany(f"INSERT OR REPLACE INTO calls VALUES ({','.join('?' * len(COLUMNS))})", rows)
        db.execute("DROP TABLE calls_v1")
    log.info("episode store %s: %d calls migrated to format %d in %.1f s", store.path, n, FORMAT, time.time() - t0)
