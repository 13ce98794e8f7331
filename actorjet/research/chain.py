"""A chain of studies that follow from each other: `actorjet research run STUDY.toml
--follow-ups N`.  When a study ends, the evidence decides the next question (follow_up.py:
the playbook, or an LLM planner checked like any spec) and the chain runs it, up to N
follow-ups, until the playbook says stop.

One registry holds the chain: ``CHAIN_DIR/chain.sqlite``, a row per study (its question, its
spec as data with the base job inline, why it was asked, its state, what it found).  Each
study keeps its own directory and registry (``study-N/``), so a SIGKILL anywhere resumes
where it stopped: a finished study is never run again, the study in flight resumes from its
own registry, and a study's end and the next question are written in one transaction.
``chain.md`` tells the chain's story: each question, its evidence, its decision, and why the
next question followed.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Callable

from actorjet.errors import UserError
from actorjet.research import follow_up
from actorjet.research.study_db import StudyRegistry, transaction
from actorjet.research.study_spec import check_study

SCHEMA = """
CREATE TABLE IF NOT EXISTS links (n INTEGER PRIMARY KEY, question TEXT NOT NULL, spec TEXT NOT NULL,
                                  why TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'queued', found TEXT);
CREATE TABLE IF NOT EXISTS chain (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class ChainRegistry:
    def __init__(self, chain_dir: str | Path):
        self.dir = Path(chain_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "chain.sqlite", timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def start(self, first: dict, follow_ups: int) -> None:
        """Link 0 is the study asked; a directory holding a chain of another first study is refused."""
        row = self.db.execute("SELECT spec FROM links WHERE n = 0").fetchone()
        if row is None:
            with transaction(self.db):
                self.db.execute("INSERT INTO links (n, question, spec, why) VALUES (0, ?, ?, ?)",
                                (first["question"], json.dumps(first), "the question asked"))
        elif check_study(json.loads(row[0]), "chain")["hash"] != check_study(first, "chain")["hash"]:
            raise UserError(f"{self.dir} holds a chain that began with another study: use another --dir")
        self.put("follow_ups", follow_ups)

    def links(self) -> list[dict]:
        return [{"n": n, "question": q, "spec": json.loads(s), "why": w, "state": st,
                 "found": json.loads(f) if f else None}
                for n, q, s, w, st, f in self.db.execute("SELECT n, question, spec, why, state, found FROM links "
                                                         "ORDER BY n")]

    def finish(self, n: int, found: dict, next_spec: dict | None, why: str) -> None:
        """Study ``n`` ended with ``found``; the next one (or why the chain stops), at once."""
        with transaction(self.db):
            self.db.execute("UPDATE links SET state = 'done', found = ? WHERE n = ?", (json.dumps(found), n))
            if next_spec is not None:
                self.db.execute("INSERT OR IGNORE INTO links (n, question, spec, why) VALUES (?, ?, ?, ?)",
                                (n + 1, next_spec["question"], json.dumps(next_spec), why))
            else:
                self.db.execute("INSERT OR REPLACE INTO chain VALUES ('stopped', ?)", (json.dumps(why),))

    def get(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM chain WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put(self, key: str, value) -> None:
        with transaction(self.db):
            self.db.execute("INSERT OR REPLACE INTO chain VALUES (?, ?)", (key, json.dumps(value)))


def as_data(study: dict) -> dict:
    """A checked study as spec data (its base job inline): what the chain stores and re-checks."""
    data = follow_up.spec_data(study, study["base_job"], study["question"], study["knobs"],
                               study["explore"]["trials"], study["seeds"], study.get("followed_by", ""))
    if study.get("planner"):
        data["planner"] = dict(study["planner"])
    return data


def run_chain(first: dict, chain_dir: str | Path, follow_ups: int, run_study: Callable[[dict, Path], None],
              min_effect: float = 0.02, planner: str = "", planner_model: str = "", say=print) -> Path:
    """Run (or resume) the chain that begins with the checked study ``first``; returns chain.md."""
    reg = ChainRegistry(chain_dir)
    reg.start(as_data(first), follow_ups)
    while True:
        links = reg.links()
        link = next((x for x in links if x["state"] != "done"), None)
        if link is None:
            break
        n = link["n"]
        study = check_study(link["spec"], f"chain study {n + 1}")
        say(f"study {n + 1} of at most {follow_ups + 1}: {study['question']}")
        run_study(study, reg.dir / f"study-{n}")
        found = follow_up.evidence(study, StudyRegistry(reg.dir / f"study-{n}"))
        done = [{"question": x["question"], "knobs": list(x["spec"]["knobs"]), "found": x["found"]}
                for x in links if x["state"] == "done"]
        done.append({"question": study["question"], "knobs": list(study["knobs"]), "found": found})
        if n >= follow_ups:
            nxt, why = None, f"the {follow_ups} follow-up{'s' * (follow_ups != 1)} asked for ran"
        else:
            nxt, why = _next(study, found, done, min_effect, planner, planner_model)
        reg.finish(n, found, nxt, why)
        say(f"next: {why}")
    return report(chain_dir)


def _next(study: dict, found: dict, done: list[dict], min_effect: float, planner: str,
          planner_model: str) -> tuple[dict | None, str]:
    """The planner's proposal if it gives a valid one, else the playbook's (saying why)."""
    rejected = ""
    if planner:
        try:
            nxt, why = follow_up.ask_planner(planner, planner_model, study, found, done)
            if nxt is not None:
                check_study(json.loads(json.dumps(nxt)), "the planner's proposal")
            return nxt, why
        except (ValueError, UserError) as e:
            rejected = f"the planner's proposal was rejected ({str(e)[:300]}); the playbook decides: "
    nxt, why = follow_up.propose(study, found, done, min_effect)
    return nxt, rejected + why


def report(chain_dir: str | Path) -> Path:
    """chain.md (and each study's report.md): each question, its evidence, its decision, and
    why the next question followed."""
    from actorjet.research import study_report

    reg = ChainRegistry(chain_dir)
    links = reg.links()
    if not links:
        raise UserError(f"{chain_dir} holds no chain")
    lines = [f"# A chain of studies: {links[0]['question']}", "",
             f"{len(links)} stud{'ies' if len(links) != 1 else 'y'}, at most {reg.get('follow_ups', 0)} follow-ups. "
             + (f"**Stopped:** {reg.get('stopped')}." if reg.get("stopped") else "Still running."), ""]
    for link in links:
        study_dir = Path(chain_dir) / f"study-{link['n']}"
        if (study_dir / "study.sqlite").exists():
            study_report.build(study_dir)
        lines += [f"## {link['n'] + 1}. {link['question']}", "", f"**Why this question:** {link['why']}.", "",
                  f"Knobs: {', '.join(f'`{k}` {json.dumps(v)}' for k, v in link['spec']['knobs'].items())}; "
                  f"report: [study-{link['n']}/report.md](study-{link['n']}/report.md)", ""]
        found = link["found"]
        if found is None:
            lines += ["*In flight.*", ""]
            continue
        lines += ["**Evidence:**", ""] + [f"- {d}" for d in found["decisions"]] + [""]
        lines += [f"**Decision:** {'adopted ' + follow_up.show(found['best']) if found['adopted'] else 'nothing adopted'}"
                  f" (explored spread {found['spread']:.3f}, largest confirmed effect {found['effect']:.3f}).", ""]
    path = Path(chain_dir) / "chain.md"
    path.write_text("\n".join(lines) + "\n")
    return path
