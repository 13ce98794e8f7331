"""`actorjet research run STUDY --follow-ups N`: studies that follow from each other.

The playbook (research/follow_up.py) on made-up evidence: an adopted change is confirmed at
3× the steps first, the chain then builds on it and moves to the next knob, a multi-knob
study's most important knob is narrowed, and the chain stops when two studies in a row find
nothing or no knob is left.  Then a real two-study chain whose second question comes from a
scripted planner, SIGKILLed between its studies and resumed: no trial runs twice, the chain
is intact, and chain.md tells its story.
"""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys

import psutil
import pytest

from actorjet.research import follow_up
from actorjet.research.chain import ChainRegistry, as_data
from actorjet.research.study_spec import check_study
from swarm import REPO, wait_until
from test_research import study, toml, trials
from test_research_ask import Planner


def found(**over) -> dict:
    return {"adopted": False, "best": {}, "spread": 0.0, "effect": 0.0, "importance": {}, "decisions": [], **over}


def link(spec: dict, evidence: dict) -> dict:
    return {"question": spec["question"], "knobs": list(spec["knobs"]), "found": evidence}


def test_an_adopted_change_is_confirmed_at_three_times_the_steps_then_built_on():
    first = check_study(study(knobs={"models.policy.lr": {"log_uniform": [1e-5, 1e-2]}}), "s")
    won = found(adopted=True, best={"models.policy.lr": 3e-4}, spread=0.2, effect=0.15)
    nxt, why = follow_up.propose(first, won, [link(first, won)], 0.02)
    long = check_study(nxt, "next")                                 # a valid study, as any spec
    assert long["followed_by"] == "long confirm" and "confirm it at 3× the steps (12)" in why
    assert long["base_job"]["train"]["steps"] == 12
    assert long["knobs"]["models.policy.lr"]["values"] == [1e-4, 3e-4]     # the base against the adopted value
    assert long["seeds"]["confirm"] == first["seeds"]["confirm"] + 2
    held = found(adopted=True, best={"models.policy.lr": 3e-4}, spread=0.1, effect=0.1)
    nxt, why = follow_up.propose(long, held, [link(first, won), link(long, held)], 0.02)
    after = check_study(nxt, "next")
    assert after["followed_by"] == "next knob" and list(after["knobs"]) == ["train.group_size"]
    assert after["base_job"]["train"]["steps"] == 4                        # the chain's own length again
    assert after["base_job"]["models"][0]["lr"] == 3e-4                    # built on the confirmed change
    assert "study the playbook's next knob, group_size" in why


def test_the_most_important_of_several_knobs_is_narrowed_around_its_best_value():
    first = check_study(study(knobs={"models.policy.lr": {"log_uniform": [1e-5, 1e-2]},
                                     "models.policy.clip": {"uniform": [0.1, 0.3]}}), "s")
    evidence = found(best={"models.policy.lr": 1e-3, "models.policy.clip": 0.2}, spread=0.3,
                     importance={"models.policy.lr": 0.8, "models.policy.clip": 0.1})
    nxt, why = follow_up.propose(first, evidence, [link(first, evidence)], 0.02)
    narrow = check_study(nxt, "next")
    low, high = narrow["knobs"]["models.policy.lr"]["values"]
    assert narrow["followed_by"] == "narrow" and list(narrow["knobs"]) == ["models.policy.lr"]
    assert 1e-5 <= low < 1e-3 < high <= 1e-2 and high / low < 1e3 / 10      # half the log range, around 1e-3
    assert "ranks first by PED-ANOVA importance (0.80)" in why


def test_the_chain_stops_after_two_quiet_studies_or_when_no_knob_is_left():
    first = check_study(study(), "s")
    quiet = found(spread=0.005, effect=0.0)
    nxt, why = follow_up.propose(first, quiet, [link(first, quiet)], 0.02)
    assert nxt is not None and "group_size" in why                        # one quiet study: go on
    second = check_study(nxt, "next")
    nxt, why = follow_up.propose(second, quiet, [link(first, quiet), link(second, quiet)], 0.02)
    assert nxt is None and "the last two studies found nothing above the stated effect size (0.02)" in why
    done = [{"question": "q", "knobs": [f"models.policy.{k}", f"train.{k}"], "found": found(spread=1.0)}
            for k in follow_up.PRIORITY]
    nxt, why = follow_up.propose(first, found(spread=1.0), done, 0.02)
    assert nxt is None and "every knob of the playbook has been studied" in why


def test_a_chain_directory_is_tied_to_its_first_study(tmp_path):
    from actorjet.errors import UserError

    reg = ChainRegistry(tmp_path)
    reg.start(as_data(check_study(study(), "s")), 1)
    reg.start(as_data(check_study(study(), "s")), 2)                      # the same first study resumes
    with pytest.raises(UserError, match="began with another study"):
        reg.start(as_data(check_study(study(question="another?"), "s")), 1)


def test_a_study_is_bound_and_a_link_finished_whole_or_not_at_all(tmp_path):
    """A crash between two statements of one record (a sqlite trigger aborts the second, as a
    SIGKILL would stop it) leaves the record unwritten, never half: a study bound without its
    start time could not resume (CI saw it: the resumed chain died on ``None + max_wall_s``)."""
    from actorjet.research.plan import make_plan
    from actorjet.research.study_db import StudyRegistry

    spec = check_study(study(), "s")
    db = sqlite3.connect(tmp_path / "study.sqlite")
    db.executescript("CREATE TABLE study (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                     "CREATE TRIGGER killed BEFORE INSERT ON study WHEN NEW.key = 'started' "
                     "BEGIN SELECT RAISE(ABORT, 'killed here'); END;")
    db.close()
    with pytest.raises(sqlite3.IntegrityError, match="killed here"):
        StudyRegistry(tmp_path).bind(spec, make_plan(spec))
    reg = StudyRegistry(tmp_path)
    assert reg.db.execute("SELECT key FROM study").fetchall() == []   # nothing of the study was kept
    reg.db.execute("DROP TRIGGER killed")
    assert reg.bind(spec, make_plan(spec)) is True and reg.get("started") is not None  # the next run binds it whole

    chain = ChainRegistry(tmp_path / "chain")
    chain.start(as_data(spec), 1)
    chain.db.execute("CREATE TRIGGER killed BEFORE INSERT ON links WHEN NEW.n = 1 "
                     "BEGIN SELECT RAISE(ABORT, 'killed here'); END")
    with pytest.raises(sqlite3.IntegrityError, match="killed here"):
        chain.finish(0, found(), as_data(spec), "next")
    assert [(l["n"], l["state"]) for l in chain.links()] == [(0, "queued")]   # not done without its successor


NEXT = {"question": "Does group size matter once lr is chosen?", "knobs": {"train.group_size": {"choice": [4, 2]}},
        "explore_trials": 2, "why": "lr settled; the group size sets the baseline's noise"}


@pytest.mark.long(minutes=2)
@pytest.mark.slow
def test_a_two_study_chain_killed_between_its_studies_resumes_with_no_trial_twice(tmp_path):
    planner = Planner()              # a scripted planner (test_research_ask.py): the follow-up is NEXT
    planner.answer = json.dumps(NEXT)
    spec = tmp_path / "chain.toml"
    spec.write_text(toml(study(knobs={"models.policy.lr": {"choice": [1e-4, 3e-4]}}, explore={"trials": 2},
                               seeds={"baseline": 1, "confirm": 1, "ablate": 1},
                               budget={"max_trials": 20, "max_wall_s": 1200, "parallel": 2})))
    out = tmp_path / "chain"
    command = [sys.executable, "-m", "actorjet.cli.main", "research", "run", str(spec), "--dir", str(out),
               "--follow-ups", "1", "--planner", planner.url]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        def between() -> bool:             # study 1 is over and the next question is written down
            return (out / "chain.sqlite").exists() and len(ChainRegistry(out).links()) == 2
        wait_until(between, 400, interval_s=0.5, what="the first study to end and the second to be asked")
        first.send_signal(signal.SIGKILL)
        first.wait()
        before = trials(out / "study-0")
        again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        planner.server.shutdown()
        planner.server.server_close()
        if first.poll() is None:
            first.kill()
    assert again.returncode == 0, again.stdout + again.stderr
    links = ChainRegistry(out).links()
    assert [x["state"] for x in links] == ["done", "done"]
    assert links[1]["question"] == "Does group size matter once lr is chosen?"
    assert len(planner.prompts) == 1                        # the next question was asked once, before the kill
    assert trials(out / "study-0") == before           # the finished study did not run again
    for n in (0, 1):
        rows = trials(out / f"study-{n}")
        keys = [(stage, arm, seed) for stage, arm, seed, *_ in rows]
        assert rows and len(keys) == len(set(keys)) and {r[3] for r in rows} <= {"done", "pruned"}, rows
    explored = {p for (p,) in sqlite3.connect(out / "study-1" / "study.sqlite").execute(
        "SELECT params FROM trials WHERE stage = 'explore'")}
    assert explored == {json.dumps({"train.group_size": 4}), json.dumps({"train.group_size": 2})}   # both arms
    story = (out / "chain.md").read_text()
    assert "## 1. does lr matter?" in story and "## 2. Does group size matter once lr is chosen?" in story
    assert "the planner at http://127.0.0.1" in story and "the baseline's noise" in story
    assert "**Evidence:**" in story and "**Stopped:** the 1 follow-up asked for ran" in story
    assert (out / "study-1" / "report.md").exists()
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left, f"processes of this chain outlived it: {left}"
    status = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "research", "status", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert status.returncode == 0 and "study 2 (done)" in status.stdout
