"""The study registry: ``STUDY_DIR/study.sqlite``, the one source of truth of a study.

Every trial with its stage, arm, knob values, full job config and its hash, seed, state
(queued → running → done | pruned | failed), attempts, run dir, periodic evals, final
metric and the tail of its log; every decision with the evidence it used.  The report is
generated from this file alone, and `run` on the same directory resumes from it.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

from actorjet.errors import UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS study (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id          INTEGER PRIMARY KEY,
    stage       TEXT NOT NULL,
    arm         TEXT NOT NULL,
    seed        INTEGER NOT NULL,
    params      TEXT NOT NULL,
    job         TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'queued',
    attempts    INTEGER NOT NULL DEFAULT 0,
    run_dir     TEXT,
    evals       TEXT NOT NULL DEFAULT '[]',
    metric      REAL,
    optuna      INTEGER,
    log_tail    TEXT,
    pid         INTEGER,
    started     REAL,
    finished    REAL,
    UNIQUE (stage, arm, seed)
);
CREATE TABLE IF NOT EXISTS decisions (id INTEGER PRIMARY KEY, stage TEXT, text TEXT, evidence TEXT, at REAL);
"""


@contextmanager
def transaction(db: sqlite3.Connection):
    """BEGIN IMMEDIATE … COMMIT, ROLLBACK on error.  The registries open their connection in
    autocommit (``isolation_level=None``), where ``with db:`` begins nothing: each statement
    would commit on its own, and a SIGKILL between two of them leaves half a record (a study
    bound without its start time, a study done without the next question)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def config_hash(job: dict) -> str:
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:12]


class StudyRegistry:
    def __init__(self, study_dir: str | Path):
        self.dir = Path(study_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "study.sqlite", timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def bind(self, study: dict, plan: dict) -> bool:
        """Tie the directory to one spec and its plan, in one transaction: True if it is new,
        UserError if it holds another."""
        row = self.db.execute("SELECT value FROM study WHERE key = 'hash'").fetchone()
        if row is None:
            with transaction(self.db):
                self.db.execute("INSERT INTO study VALUES ('hash', ?)", (study["hash"],))
                self.db.execute("INSERT INTO study VALUES ('spec', ?)", (json.dumps(study),))
                self.db.execute("INSERT INTO study VALUES ('started', ?)", (json.dumps(time.time()),))
                self.db.execute("INSERT INTO study VALUES ('plan', ?)", (json.dumps(plan),))
            return True
        if row[0] != study["hash"]:
            raise UserError(f"{self.dir} holds a study of another spec (hash {row[0]}, this one {study['hash']}): "
                            "use another --dir, or the spec that started it")
        return False

    def get(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM study WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put(self, key: str, value) -> None:
        with transaction(self.db):
            self.db.execute("INSERT OR REPLACE INTO study VALUES (?, ?)", (key, json.dumps(value)))

    def add_trial(self, stage: str, arm: str, seed: int, params: dict, job: dict, optuna: int | None = None) -> int:
        """A planned trial (idempotent: the same stage, arm and seed is the same trial)."""
        with transaction(self.db):
            self.db.execute("INSERT OR IGNORE INTO trials (stage, arm, seed, params, job, config_hash, optuna) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?)", (stage, arm, seed, json.dumps(params), json.dumps(job),
                                                            config_hash(job), optuna))
        return self.db.execute("SELECT id FROM trials WHERE stage = ? AND arm = ? AND seed = ?",
                               (stage, arm, seed)).fetchone()[0]

    def trials(self, stage: str | None = None, state: str | None = None) -> list[dict]:
        query, args = "SELECT * FROM trials WHERE 1", []
        if stage:
            query, args = query + " AND stage = ?", args + [stage]
        if state:
            query, args = query + " AND state = ?", args + [state]
        cur = self.db.execute(query + " ORDER BY id", args)
        names = [d[0] for d in cur.description]
        out = []
        for row in cur.fetchall():
            t = dict(zip(names, row))
            t["params"], t["job"], t["evals"] = json.loads(t["params"]), json.loads(t["job"]), json.loads(t["evals"])
            out.append(t)
        return out

    def update(self, trial_id: int, **fields) -> None:
        for key in ("params", "job", "evals"):
            if key in fields:
                fields[key] = json.dumps(fields[key])
        with transaction(self.db):
            self.db.execute(f"UPDATE trials SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                            (*fields.values(), trial_id))

    def decide(self, stage: str, text: str, evidence: dict) -> None:
        with transaction(self.db):
            self.db.execute("INSERT INTO decisions (stage, text, evidence, at) VALUES (?, ?, ?, ?)",
                            (stage, text, json.dumps(evidence), time.time()))

    def decisions(self) -> list[dict]:
        return [{"stage": s, "text": t, "evidence": json.loads(e), "at": a}
                for s, t, e, a in self.db.execute("SELECT stage, text, evidence, at FROM decisions ORDER BY id")]

    def decided(self, stage: str) -> bool:
        return self.db.execute("SELECT 1 FROM decisions WHERE stage = ?", (stage,)).fetchone() is not None
