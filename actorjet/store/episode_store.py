"""One model's store of episodes: its recorded calls, its episodes' rewards, its GRPO groups.

One SQLite file per model, ``episodes-MODEL.sqlite`` in the run directory of the node that
runs the model's subtree (engine, gateway, learner are placed together; nothing here reads
another host's file).  Two processes open it, and nothing else travels between them:

    gateway   add()            every recorded call, written once per event-loop turn (flush),
                               before the agent sees the answer
              put_results()    the rewards of finished episodes (from a runner, or a client's
                               /end), with their group; a group is *complete* when every member
                               has a reward — then it is trainable
              close()          episodes that will never be trained (failed, expired, aborted):
                               their key is refused, their calls and reward are deleted
    learner   take()           claims whole complete groups in one transaction (next_batch)
              trained()        marks them trained at step s once the step is done
              rewind(k)        at start: groups trained after the checkpoint k, or taken and
                               never trained, are pending again (a restarted learner pulls again)
              quarantine()     a group that cannot be trained, kept with its cause
              retain(k)        after a checkpoint at k: groups trained up to k leave the store,
                               counted as retired (store/upkeep.py)

So after any crash: complete = trained (retired included) + pending + quarantined, and no
group is trained twice in the weights that survive.  WAL mode: the learner reads while the
gateway writes.  Calls are kept as references to the longest prefix their episode recorded
before (store/records.py): O(new tokens) per call.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from actorjet.store import records as records_mod
from actorjet.store.completed import group_rewards

COLUMNS = records_mod.ROW_COLUMNS

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (              -- store/records.py: O(new tokens) per call
    episode_id  TEXT NOT NULL,
    call_index  INTEGER NOT NULL,
    choice      INTEGER NOT NULL,
    role        TEXT NOT NULL,
    ref_index   INTEGER,                      -- the call of this episode whose tokens it starts with
    ref_choice  INTEGER,
    prefix_len  INTEGER NOT NULL,             -- how many of that call's prompt + completion tokens
    new_ids     BLOB NOT NULL,                -- int32: the prompt's tokens after them
    completion_ids BLOB NOT NULL,             -- int32
    logprobs    BLOB NOT NULL,                -- float32, one per completion token
    weight_version INTEGER NOT NULL,
    temperature REAL NOT NULL,
    msg_prefix  INTEGER NOT NULL,             -- how many of that call's messages it starts with
    new_messages TEXT NOT NULL,               -- JSON: the rest
    tools       TEXT,                         -- JSON (NULL: the same as the referenced call's)
    meta        TEXT NOT NULL,                -- JSON: model, params, finish_reason, created
    PRIMARY KEY (episode_id, call_index, choice)
);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id  TEXT PRIMARY KEY,
    group_id    TEXT NOT NULL,
    member      TEXT NOT NULL,                -- its place in the group (a retry takes the same place)
    reward      TEXT,                         -- JSON (NULL: a client episode opened, not ended)
    stored_at   REAL NOT NULL,
    times       TEXT                          -- JSON [leased, first call, last answer] (the step timeline)
);
CREATE INDEX IF NOT EXISTS episodes_by_group ON episodes (group_id);
CREATE TABLE IF NOT EXISTS groups (
    group_id     TEXT PRIMARY KEY,
    task_name    TEXT,
    behavior     TEXT,
    version      INTEGER,
    size         INTEGER NOT NULL,
    complete_at  REAL,                        -- every member has a reward (NULL: not yet)
    members      INTEGER,                     -- members with a reward, as last judged (counts())
    taken        INTEGER,                     -- claimed by the learner for a batch
    taken_at     REAL,                        -- when (the step timeline)
    trained_step INTEGER,                     -- learner step that trained it
    quarantine   TEXT,                        -- {cause, sample}: it cannot be trained
    logged       REAL                         -- told to the head as complete (store/completed.py)
);
CREATE INDEX IF NOT EXISTS trainable ON groups (complete_at, taken, quarantine);
CREATE INDEX IF NOT EXISTS unlogged ON groups (logged, complete_at);
CREATE TABLE IF NOT EXISTS closed (             -- keys refused from now on, and why
    episode_id TEXT PRIMARY KEY, cause TEXT, closed_at REAL
);
CREATE TABLE IF NOT EXISTS retired (          -- what retention deleted, still counted
    id INTEGER PRIMARY KEY CHECK (id = 1), groups INTEGER NOT NULL, episodes INTEGER NOT NULL
);
"""
FORMAT = 2          # PRAGMA user_version; 0/1: calls as JSON records (migrated on open)
PENDING = "complete_at IS NOT NULL AND taken IS NULL AND quarantine IS NULL"
ENDED = "it ended: its reward is stored"     # a closed key whose calls stay (no call after a reward)
MAX_CLOSED_IN_MEMORY = 200_000
EPISODES_PER_QUERY = 500      # well under SQLite's 32,766 parameters a statement


def path_for(run_dir: str | Path, model: str) -> Path:
    return Path(run_dir) / f"episodes-{model}.sqlite"


class EpisodeStore:
    def __init__(self, path: str | Path = ":memory:"):
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # one connection, used under a lock: the gateway's loop and its writer thread share it
        self.path = path
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")      # a new file: retention gives pages back
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")     # WAL + NORMAL: durable across process crashes
        self.db.execute("PRAGMA journal_size_limit=16777216")   # the WAL file shrinks back after a checkpoint
        self.lock = threading.RLock()
        with self.lock:
            self._open_format()
        self.buffer: list = []                   # calls added, not yet flushed
        self.counters: dict[str, int] = {}       # open episodes → their next call index
        self.times: dict[str, list] = {}         # open episodes → [leased, first call, last answer] (wall clock)
        self.tails = records_mod.Tails()             # open episodes → their latest calls (references)
        # episode → why its key is refused: closed ones (table ``closed``) and ended ones (a
        # reward in ``episodes``: not written twice; after retention a forgotten key's late
        # calls are orphans, deleted with the closed keys' calls)
        self.closed = {e: ENDED for (e,) in self.db.execute(
            "SELECT episode_id FROM episodes WHERE reward IS NOT NULL ORDER BY stored_at DESC LIMIT ?",
            (MAX_CLOSED_IN_MEMORY,))}
        self.closed.update(self.db.execute(
            "SELECT episode_id, COALESCE(cause, 'closed') FROM closed ORDER BY rowid DESC LIMIT ?",
            (MAX_CLOSED_IN_MEMORY,)))

    def _open_format(self) -> None:
        """Create the tables, or bring a store of an older format up to this one
        (store/upkeep.py: calls kept as JSON records re-encoded, columns added since)."""
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        old = [r[1] for r in self.db.execute("PRAGMA table_info(calls)")]
        if version > FORMAT:
            from actorjet.errors import UserError
            raise UserError(f"the episode store {self.path} has format {version}, newer than this ActorJet "
                            f"reads ({FORMAT}): upgrade ActorJet, or start a new run directory")
        from actorjet.store import upkeep
        if "record" in old:
            upkeep.migrate(self)
        upkeep.add_columns(self.db)
        self.db.executescript(SCHEMA)
        self.db.execute(f"PRAGMA user_version = {FORMAT}")

    def close_db(self) -> None:
        with self.lock:
            self.db.close()

    def _tx(self):
        return _Transaction(self.db, self.lock)

    # -- gateway: calls -----------------------------------------------------------------
    def is_closed(self, episode_id: str) -> bool:
        return episode_id in self.closed

    def closed_cause(self, episode_id: str) -> str:
        return self.closed.get(episode_id) or "closed"

    def call_started(self, episode_id: str) -> None:
        """A call of this episode arrived: its first is a stage of the step timeline."""
        if episode_id not in self.times and episode_id not in self.closed:
            self.times[episode_id] = [None, time.time(), None]

    def next_index(self, episode_id: str) -> int:
        """The index of the call being recorded (it was answered now: the timeline's last answer)."""
        with self.lock:
            if episode_id in self.times:
                self.times[episode_id][2] = time.time()
            if episode_id not in self.counters:     # after a gateway restart: go on after the stored calls
                (last,) = self.db.execute("SELECT MAX(call_index) FROM calls WHERE episode_id = ?",
                                          (episode_id,)).fetchone()
                self.counters[episode_id] = -1 if last is None else last
            self.counters[episode_id] += 1
            return self.counters[episode_id]

    def add(self, records: list) -> None:
        """Calls of a turn of the event loop: kept until ``flush`` writes them together."""
        with self.lock:
            self.buffer += records

    def flush(self) -> int:
        """Write every added call in one transaction (the gateway's writer thread)."""
        with self.lock:
            records, self.buffer = self.buffer, []
            if records:
                rows = [records_mod.encode(r, self.tails) for r in records if r.episode_id not in self.closed]
                insert = f"INSERT OR REPLACE INTO calls VALUES ({','.join('?' * len(COLUMNS))})"
                try:
                    with self._tx() as db:
                        db.executemany(insert, rows)
                except sqlite3.Error:      # not written (a full disk): later calls must not refer to them
                    for r in records:
                        self.tails.forget(r.episode_id)
                    raise
            return len(records)

    def calls(self, episode_ids: list[str]) -> dict[str, list[dict]]:
        """The recorded calls of these episodes, in order, each whole (prompt_ids, messages and
        the rest of a CallRecord, plus ``prefix``: [call, choice, tokens] it was stored against).
        For people and tests: O(T·C) for an episode of T calls; the learner reads ``take``."""
        self.flush()
        return {e: [records_mod.whole(c) for c in calls] for e, calls in self._compact(episode_ids).items()}

    def _compact(self, episode_ids: list[str], db=None) -> dict[str, list[dict]]:
        """Each episode's calls, decoded (rl/calls.py); ValueError on a broken reference."""
        return {e: records_mod.decode(rows) for e, rows in self._rows(episode_ids, db).items()}

    def _rows(self, episode_ids: list[str], db=None) -> dict[str, list[tuple]]:
        """Each episode's call rows in call order, a few hundred episodes per query (a query per
        episode had been a third of the time the learner took to claim a batch)."""
        rows: dict[str, list[tuple]] = {e: [] for e in episode_ids}
        ids = list(rows)
        with self.lock:
            db = db or self.db
            for i in range(0, len(ids), EPISODES_PER_QUERY):
                part = ids[i:i + EPISODES_PER_QUERY]
                for row in db.execute(f"SELECT {','.join(COLUMNS)} FROM calls WHERE episode_id IN "
                                      f"({','.join('?' * len(part))}) ORDER BY episode_id, call_index, choice", part):
                    rows[row[0]].append(row)
        return rows

    def open_episodes(self) -> int:
        """Episodes this gateway is recording calls for (in memory: a call counter each)."""
        return len(self.counters)

    # -- gateway: results ----------------------------------------------------------------
    def open_client(self, episode_id: str, group_id: str, size: int) -> None:
        """A client-mode episode: its group is known at open, its reward at /end."""
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO groups (group_id, task_name, behavior, version, size) "
                       "VALUES (?, 'client', 'client', 0, ?)", (group_id, size))
            now = time.time()
            db.execute("INSERT OR IGNORE INTO episodes (episode_id, group_id, member, reward, stored_at) "
                       "VALUES (?, ?, ?, NULL, ?)", (episode_id, group_id, episode_id, now))
        self.times.setdefault(episode_id, [now, None, None])     # a client's episode is its own lease

    def client_group(self, episode_id: str) -> tuple[str, int] | None:
        with self.lock:
            return self.db.execute("SELECT g.group_id, g.size FROM episodes e JOIN groups g USING (group_id) "
                                   "WHERE e.episode_id = ?", (episode_id,)).fetchone()

    def put_results(self, group: dict, episodes: list[dict]) -> list[str]:
        """Store finished episodes' rewards (``episodes``: episode_id, member, reward, and
        leased_at when known) with their group (group_id, task_name, behavior, version, size),
        after every call added so far.
        Returns the episodes refused because they were closed; idempotent.  A stored episode's
        key is refused from then on (``ENDED``): no call is ever recorded after its reward."""
        self.flush()
        refused = [e["episode_id"] for e in episodes if self.closed.get(e["episode_id"], ENDED) != ENDED]
        now = time.time()
        group_row = (group["group_id"], group.get("task_name"), group.get("behavior"), group.get("version"),
                     group["size"])
        episode_rows = [(e["episode_id"], group["group_id"], str(e["member"]), json.dumps(e["reward"]), now,
                         self._times(e)) for e in episodes if e["episode_id"] not in refused]
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO groups (group_id, task_name, behavior, version, size) "
                       "VALUES (?, ?, ?, ?, ?)", group_row)
            db.executemany("INSERT OR REPLACE INTO episodes VALUES (?, ?, ?, ?, ?, ?)", episode_rows)
            self._judge(db, group["group_id"], now)
        with self.lock:
            for e in episodes:
                if e["episode_id"] not in refused:
                    self._remember_closed(e["episode_id"], ENDED)
        return refused

    def _times(self, episode: dict) -> str:
        """[leased, first call, last answer] of a finished episode, as JSON (None: not seen
        here, e.g. the gateway restarted during the episode)."""
        leased, first, last = self.times.get(episode["episode_id"], [None, None, None])
        return json.dumps([episode.get("leased_at", leased), first, last])

    def _remember_closed(self, episode_id: str, cause: str) -> None:
        self.closed[episode_id] = cause
        self.counters.pop(episode_id, None)
        self.times.pop(episode_id, None)
        self.tails.forget(episode_id)
        while len(self.closed) > MAX_CLOSED_IN_MEMORY:
            self.closed.pop(next(iter(self.closed)))

    @staticmethod
    def _judge(db, group_id: str, now: float) -> None:
        """Complete when every member has a reward; an untaken group can become incomplete
        again when one of its episodes is closed.  A taken group is judged no more: its
        ``members`` are the ones the learner took (what ``counts`` reports once trained)."""
        db.execute("UPDATE groups SET members = (SELECT COUNT(DISTINCT member) FROM episodes "
                   "WHERE group_id = ?1 AND reward IS NOT NULL) WHERE group_id = ?1 AND taken IS NULL", (group_id,))
        db.execute("UPDATE groups SET complete_at = CASE WHEN members >= size THEN COALESCE(complete_at, ?2) END "
                   "WHERE group_id = ?1 AND taken IS NULL", (group_id, now))

    def close(self, episode_ids: list[str], cause: str = "") -> None:
        """Episodes that will never be trained: refuse their keys (saying ``cause``), delete
        their calls and reward (unless their group was taken already: then they are part of
        what was trained)."""
        if not episode_ids:
            return
        cause = cause or "closed"
        with self.lock:
            for e in episode_ids:
                self._remember_closed(e, cause)
            self.buffer = [r for r in self.buffer if r.episode_id not in self.closed]
        now = time.time()
        with self._tx() as db:
            db.executemany("INSERT OR REPLACE INTO closed VALUES (?, ?, ?)", [(e, cause, now) for e in episode_ids])
            marks = ",".join("?" * len(episode_ids))
            groups = [g for (g,) in db.execute(f"SELECT DISTINCT group_id FROM episodes WHERE episode_id IN "
                                               f"({marks})", episode_ids)]
            free = f"episode_id IN ({marks}) AND group_id NOT IN (SELECT group_id FROM groups WHERE taken IS NOT NULL)"
            db.execute(f"DELETE FROM calls WHERE episode_id IN ({marks}) AND episode_id NOT IN "
                       f"(SELECT episode_id FROM episodes WHERE group_id IN (SELECT group_id FROM groups "
                       f"WHERE taken IS NOT NULL))", episode_ids)
            db.execute(f"DELETE FROM episodes WHERE {free}", episode_ids)
            for g in groups:
                self._judge(db, g, now)

    # -- learner ----------------------------------------------------------------------------
    def rewind(self, step: int) -> int:
        """A (re)started learner at checkpoint ``step``: what it took and did not train, and
        what it trained after the checkpoint (lost with the weights that saw it), is pending."""
        with self._tx() as db:
            return db.execute("UPDATE groups SET taken = NULL, trained_step = NULL WHERE taken IS NOT NULL "
                              "AND quarantine IS NULL AND (trained_step IS NULL OR trained_step > ?)",
                              (step,)).rowcount

    def pending_by_task(self) -> dict[str, tuple[int, float]]:
        """task → (complete groups pending, when the last one became complete)."""
        with self.lock:
            return {t: (n, last) for t, n, last in self.db.execute(
                f"SELECT task_name, COUNT(*), MAX(complete_at) FROM groups WHERE {PENDING} GROUP BY task_name")}

    def last_complete(self) -> dict[str, float]:
        """task → when its last group became complete (taken or not): is the task flowing?"""
        with self.lock:
            return dict(self.db.execute("SELECT task_name, MAX(complete_at) FROM groups GROUP BY task_name"))

    def take(self, quota: dict[str, int], total: int) -> list[dict]:
        """Claim whole complete groups in one transaction, each with its rewards and calls:
        the oldest ``quota[task]`` of each task, then the oldest of any task up to ``total``."""
        with self._tx() as db:
            ids: list[str] = []
            for task, n in [*quota.items(), (None, total)]:
                n = min(n, total - len(ids))
                if n <= 0:
                    continue
                query, args = f"SELECT group_id FROM groups WHERE {PENDING}", []
                if task is not None:
                    query, args = query + " AND task_name = ?", [task]
                if ids:
                    query += f" AND group_id NOT IN ({','.join('?' * len(ids))})"
                    args += ids
                ids += [g for (g,) in db.execute(query + " ORDER BY complete_at LIMIT ?", (*args, n))]
            now = time.time()
            db.executemany("UPDATE groups SET taken = 1, taken_at = ? WHERE group_id = ?", [(now, g) for g in ids])
            return [self._group(db, g) for g in ids]

    def _group(self, db, group_id: str) -> dict:
        task, behavior, version = db.execute("SELECT task_name, behavior, version FROM groups WHERE group_id = ?",
                                             (group_id,)).fetchone()
        rewards = group_rewards(db, group_id)
        rows = self._rows(list(rewards), db)
        calls = {}            # decoded one by one: a broken reference marks only its episode
        for e in rewards:
            try:
                calls[e] = records_mod.decode(rows[e])
            except ValueError as err:       # a broken reference: the learner quarantines the group
                calls[e] = [{"broken": str(err)}]
        return {"group_id": group_id, "task_name": task, "behavior": behavior, "version": version,
                "rewards": rewards, "calls": calls, "timeline": timeline(db, group_id, list(rewards))}

    def untake(self, group_ids: list[str]) -> None:
        with self._tx() as db:
            db.executemany("UPDATE groups SET taken = NULL WHERE group_id = ? AND trained_step IS NULL",
                           [(g,) for g in group_ids])

    def trained(self, group_ids: list[str], step: int) -> None:
        with self._tx() as db:
            db.executemany("UPDATE groups SET trained_step = ? WHERE group_id = ?", [(step, g) for g in group_ids])

    def quarantine(self, group_id: str, cause: str, sample: str = "") -> None:
        """Take a group out of training for good, keeping it, its cause and a sample of it."""
        with self._tx() as db:
            db.execute("UPDATE groups SET quarantine = ?, taken = 1, trained_step = NULL WHERE group_id = ?",
                       (json.dumps({"cause": cause[:500], "sample": sample[:500]}), group_id))

    def quarantined(self) -> list[dict]:
        with self.lock:
            return [{"group_id": g, **json.loads(q)} for g, q in self.db.execute(
                "SELECT group_id, quarantine FROM groups WHERE quarantine IS NOT NULL")]

    def retain(self, step: int, archive: Path | None = None, keep_closed_s: float = 7200.0) -> dict[str, int]:
        """Retention after a checkpoint at ``step``: store/upkeep.py."""
        from actorjet.store import upkeep
        return upkeep.retain(self, step, archive, keep_closed_s)

    def counts(self) -> dict[str, int]:
        """Groups complete, trained, quarantined, pending; episodes in trained groups (what
        `status` reports as episodes.trained).  Retired groups (``retain``) count as trained.
        The learner sends them after every step: one pass over the groups, never the episodes
        (their distinct members made it 8.6 ms at 1,600 groups, 30 ms at 6,400, under the
        lock the gateway's writer waits on)."""
        with self.lock:
            complete, trained, bad, episodes = self.db.execute(
                "SELECT COUNT(*), COUNT(trained_step), COUNT(quarantine), "
                "COALESCE(SUM(CASE WHEN trained_step IS NOT NULL THEN members END), 0) FROM groups "
                "WHERE complete_at IS NOT NULL").fetchone()
            old_groups, old_episodes = self.db.execute(
                "SELECT COALESCE(MAX(groups), 0), COALESCE(MAX(episodes), 0) FROM retired").fetchone()
        complete, trained, episodes = complete + old_groups, trained + old_groups, episodes + old_episodes
        return {"complete": complete, "trained": trained, "quarantined": bad,
                "pending": complete - trained - bad, "episodes_trained": episodes}


def timeline(db, group_id: str, episode_ids: list[str]) -> list[list]:
    """The step timeline of a group's episodes as far as the store knows it: per episode
    [episode_id, leased, first call, last answer, stored, complete, taken] (wall clock; the
    learner adds trained, the engine served: monitor/timeline.py)."""
    complete, taken = db.execute("SELECT complete_at, taken_at FROM groups WHERE group_id = ?", (group_id,)).fetchone()
    rows = {e: (stored, times) for e, stored, times in db.execute(
        "SELECT episode_id, stored_at, times FROM episodes WHERE group_id = ?", (group_id,))}
    out = []
    for e in episode_ids:
        stored, times = rows[e]
        out.append([e, *(json.loads(times) if times else [None, None, None]), stored, complete, taken])
    return out


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error), under the store's lock."""

    def __init__(self, db: sqlite3.Connection, lock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_):
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()
        return False
