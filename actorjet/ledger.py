"""The durable ledger: every finished GRPO group, from the moment it is acknowledged until
(and after) it is trained.  SQLite in WAL mode, ``RUN_DIR/ledger.sqlite``.

Only the merger opens it (a learner may run on another node): it calls these itself, or on
a learner's message (Claim, Rewind, Quarantine).

    store_many()  finished groups' calls and rewards, per model, in one transaction,
                  *before* the registry is told the group is safe
    assign()      groups taken into a batch file
    claim()       (learner's Claim) a batch's groups marked trained at step s, all or nothing
    rewind()      (learner's Rewind) after a restart from the checkpoint at step k: groups
                  trained after k were lost with the crashed weights, so they are pending again
    release()     batches that were never trained (a restarted merger or learner) go back
    quarantine()  a group that cannot be trained (a reward that cannot be normalized, calls
                  that cannot be packed, a step that failed on it): kept with its cause

So after any crash: finished = trained + pending + quarantined, and no group is trained twice
in the weights that survive.  Each write is a short transaction; WAL lets readers (tests,
benches, sqlite3 by hand) go on while the merger writes.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    group_id     TEXT NOT NULL,
    model        TEXT NOT NULL,
    task_name    TEXT,
    behavior     TEXT,
    version      INTEGER,
    rewards      TEXT NOT NULL,          -- {episode_id: reward}
    calls        TEXT NOT NULL,          -- {episode_id: [call records]}
    stored_at    REAL NOT NULL,
    batch        TEXT,                   -- batch file it was packed into (NULL: pending)
    trained_step INTEGER,                -- learner step that trained it (NULL: not yet)
    quarantine   TEXT,                   -- {cause, sample} of a group that cannot be trained
    PRIMARY KEY (group_id, model)
);
CREATE INDEX IF NOT EXISTS pending ON groups (model, trained_step, batch);
"""


class Ledger:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "ledger.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)   # explicit transactions
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")     # WAL + NORMAL: durable across process crashes
        self.db.executescript(SCHEMA)
        columns = [row[1] for row in self.db.execute("PRAGMA table_info(groups)")]
        if "quarantine" not in columns:      # ledgers written before quarantine existed
            self.db.execute("ALTER TABLE groups ADD COLUMN quarantine TEXT")

    def close(self) -> None:
        self.db.close()

    def _tx(self):
        return _Transaction(self.db)

    # -- merger ---------------------------------------------------------------------------
    def store_many(self, items: list[tuple[dict, dict[str, dict]]]) -> list[bool]:
        """Commit finished groups (one row per model each) in one transaction.  For each, False
        if it was stored before (a duplicate delivery): the caller must not count it again."""
        for group, calls_by_model in items:
            if not calls_by_model:
                raise ValueError(f"group {group['group_id']}: no model to store it for")
        stored = []
        with self._tx() as db:
            for group, calls_by_model in items:
                if db.execute("SELECT 1 FROM groups WHERE group_id = ?", (group["group_id"],)).fetchone():
                    stored.append(False)
                    continue
                rewards = json.dumps({e["episode_id"]: e["reward"] for e in group["episodes"]})
                for model, calls in calls_by_model.items():
                    db.execute("INSERT INTO groups (group_id, model, task_name, behavior, version, rewards, "
                               "calls, stored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (group["group_id"], model, group.get("task_name"), group.get("behavior"),
                                group.get("version"), rewards, json.dumps(calls), time.time()))
                stored.append(True)
        return stored

    def pending(self, model: str, limit: int, task: str | None = None, skip: tuple = ()) -> list[dict]:
        """The oldest pending groups (of one task if given, leaving out ``skip``)."""
        query = ("SELECT group_id, task_name, behavior, version, rewards, calls FROM groups "
                 "WHERE model = ? AND trained_step IS NULL AND batch IS NULL AND quarantine IS NULL")
        args: list = [model]
        if task is not None:
            query += " AND task_name = ?"
            args.append(task)
        if skip:
            query += f" AND group_id NOT IN ({','.join('?' * len(skip))})"
            args += list(skip)
        rows = self.db.execute(query + " ORDER BY stored_at LIMIT ?", (*args, limit)).fetchall()
        return [{"group_id": g, "task_name": t, "behavior": b, "version": v,
                 "rewards": json.loads(r), "calls": json.loads(c)} for g, t, b, v, r, c in rows]

    def pending_by_task(self, model: str) -> dict[str, tuple[int, float]]:
        """task → (pending groups, when the oldest was stored)."""
        return {t: (n, oldest) for t, n, oldest in self.db.execute(
            "SELECT task_name, COUNT(*), MIN(stored_at) FROM groups WHERE model = ? AND trained_step IS NULL "
            "AND batch IS NULL AND quarantine IS NULL GROUP BY task_name", (model,))}

    def count_pending(self, model: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM groups WHERE model = ? AND trained_step IS NULL "
                               "AND batch IS NULL AND quarantine IS NULL", (model,)).fetchone()[0]

    def episodes(self, model: str, group_ids: list[str]) -> int:
        """Episodes in these groups (by primary key: cheap on every learner step)."""
        marks = ",".join("?" * len(group_ids))
        return self.db.execute(f"SELECT COUNT(*) FROM groups, json_each(groups.rewards) WHERE model = ? "
                               f"AND group_id IN ({marks})", (model, *group_ids)).fetchone()[0]

    def quarantine(self, model: str, group_id: str, cause: str, sample: str = "") -> None:
        """Take a group out of training for good, keeping it, its cause and a sample of it."""
        with self._tx() as db:
            db.execute("UPDATE groups SET quarantine = ?, batch = NULL, trained_step = NULL "
                       "WHERE model = ? AND group_id = ?",
                       (json.dumps({"cause": cause[:500], "sample": sample[:500]}), model, group_id))

    def quarantined(self) -> list[dict]:
        return [{"group_id": g, "model": m, **json.loads(q)} for g, m, q in self.db.execute(
            "SELECT group_id, model, quarantine FROM groups WHERE quarantine IS NOT NULL")]

    def assign(self, model: str, group_ids: list[str], batch: str) -> None:
        with self._tx() as db:
            db.executemany("UPDATE groups SET batch = ? WHERE model = ? AND group_id = ?",
                           [(batch, model, g) for g in group_ids])

    def release(self, model: str | None = None) -> int:
        """Untrained groups in batch files go back to pending (their batches are forgotten)."""
        with self._tx() as db:
            cur = db.execute("UPDATE groups SET batch = NULL WHERE trained_step IS NULL AND batch IS NOT NULL"
                             + (" AND model = ?" if model else ""), (model,) if model else ())
            return cur.rowcount

    # -- learner --------------------------------------------------------------------------
    def claim(self, model: str, group_ids: list[str], step: int) -> bool:
        """Mark a batch's groups trained at ``step`` — only if none of them was trained
        already; otherwise change nothing, release the untrained ones, and say False."""
        with self._tx() as db:
            marks = ",".join("?" * len(group_ids))
            trained = db.execute(f"SELECT COUNT(*) FROM groups WHERE model = ? AND group_id IN ({marks}) "
                                 "AND (trained_step IS NOT NULL OR quarantine IS NOT NULL)", (model, *group_ids)).fetchone()[0]
            if trained:
                db.execute(f"UPDATE groups SET batch = NULL WHERE model = ? AND group_id IN ({marks}) "
                           "AND trained_step IS NULL", (model, *group_ids))
                return False
            db.execute(f"UPDATE groups SET trained_step = ? WHERE model = ? AND group_id IN ({marks})",
                       (step, model, *group_ids))
            return True

    def rewind(self, model: str, step: int) -> int:
        """Groups trained after ``step`` are pending again (the weights that saw them are gone)."""
        with self._tx() as db:
            cur = db.execute("UPDATE groups SET trained_step = NULL, batch = NULL WHERE model = ? "
                             "AND trained_step > ?", (model, step))
            return cur.rowcount

    # -- accounting -----------------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, int]]:
        """Per model: groups finished (stored), trained, quarantined and pending, and the
        episodes in trained groups (what `status` reports as episodes.trained)."""
        out = {}
        for model, stored, trained, bad, episodes in self.db.execute(
                "SELECT model, COUNT(*), COUNT(trained_step), COUNT(quarantine), "
                "COALESCE(SUM(CASE WHEN trained_step IS NOT NULL THEN "
                "(SELECT COUNT(*) FROM json_each(rewards)) END), 0) FROM groups GROUP BY model"):
            out[model] = {"finished": stored, "trained": trained, "quarantined": bad,
                          "pending": stored - trained - bad, "episodes_trained": episodes}
        return out


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error): one writer at a time, never half a group."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
