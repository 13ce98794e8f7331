"""`actorjet research run --head`: a study's trials run on an existing swarm's nodes.

The book that places them (registry/trials.py) and the door's check of a submission are
plain functions tested here directly; the whole path runs with every host in its own network
namespace: the swarm's head, two nodes joined with ``--trials 1``, and the controller on an
outbound-only laptop that reaches nothing but the head's door.  One trial's node is killed
while it trains: the trial is re-run on the other node and counted once.
"""
import json
import os
import re
import signal
import sqlite3
import urllib.request

import pytest

from rich.console import Console

from actorjet.actors.door import check_trial
from actorjet.cli.tables import print_status
from actorjet.registry.nodes import Node
from actorjet.registry.trials import TrialBook, TrialEnded, TrialProgress
from actorjet.serving.openai_api import ApiError
from swarm import Proc, wait_until
from test_research import study, toml

JOB = study()["base_job"]


def nodes(**trials) -> list[Node]:
    return [Node(node_id=f"{name}-1", name=name, slots=0, trials=n) for name, n in trials.items()]


def test_trials_go_where_most_trial_slots_are_free_and_die_with_their_node():
    book, live = TrialBook(), nodes(alpha=1, beta=2)
    assert book.place("a", live).name == "beta"          # two free beats one
    assert book.place("b", live).name == "beta"          # 1 vs 1: by name (beta > alpha), deterministic
    assert book.place("c", live).name == "alpha"
    assert book.place("d", live) == "no free trial capacity: 3 trial slot(s) on live nodes, all busy"
    assert "already starting" in book.place("a", live)
    assert book.capacity(live)["free"] == 0
    assert book.progress(TrialProgress("a", 2, [[2, 0.5]])) and book.trials["a"].state == "running"
    assert [t.trial_id for t in book.node_lost("beta-1", "no heartbeat for 6 s")] == ["a", "b"]
    assert book.trials["a"].reason == "node beta lost: no heartbeat for 6 s"
    assert not book.progress(TrialProgress("a", 3, []))   # a lost trial's node is told to stop it
    assert book.ended(TrialEnded("a", 0)) is None         # and its late end changes nothing
    assert book.trials["a"].state == "lost"
    live[1].alive = False
    assert book.capacity(live) == {"total": 1, "free": 0, "nodes": {"alpha": {"trials": 1, "busy": 1}}}
    assert book.ended(TrialEnded("c", 1, "boom")).state == "failed"
    assert book.place("e", live).name == "alpha"
    book.cancel("e")
    assert book.ended(TrialEnded("e", -15)).state == "stopped"
    assert book.place("f", nodes(alpha=0)) == "no live node hosts trials (join one with `actorjet join HEAD --trials N`)"


@pytest.mark.parametrize("body,message", [
    ({"trial_id": "../up", "job": JOB}, "'trial_id' must be 1-200 characters"),
    ({"trial_id": "", "job": JOB}, "'trial_id' must be 1-200 characters"),
    ({"trial_id": "t1"}, "'job' must be a job as an object"),
    ({"trial_id": "t1", "job": {"models": [{"name": "p", "source": "tiny-arith", "lrr": 1}]}}, "unknown field 'lrr'"),
    ({"trial_id": "t1", "job": {"models": "policy"}}, "job"),
    ({"trial_id": "t1", "job": JOB, "model_seed": -1}, "'model_seed' must be an integer"),
    ({"trial_id": "t1", "job": JOB, "slots": True}, "'slots' must be an integer from 0 to 64"),
])
def test_a_bad_trial_submission_is_a_clear_400(body, message):
    with pytest.raises(ApiError) as e:
        check_trial(body)
    assert e.value.status == 400 and message in str(e.value)


def test_a_good_submission_is_filled_in_like_any_job():
    sub = check_trial({"trial_id": "s-t1-ab12", "job": JOB, "model_seed": 7})
    assert (sub.trial_id, sub.model_seed, sub.slots) == ("s-t1-ab12", 7, 2)
    assert sub.job["train"]["steps"] == 4 and sub.job["models"][0]["lr"] > 0     # defaults filled


def door_trials(url: str, token: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/actorjet/trials", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def door_status(url: str, token: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/actorjet/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["status"]


@pytest.mark.slow
def test_trials_run_on_a_swarms_nodes_and_a_lost_nodes_trial_runs_again_elsewhere(swarm, network, tmp_path):
    head, alpha, beta, laptop = (network.host(n) for n in ("head", "alpha", "beta", "laptop"))
    network.outbound_only(laptop)
    _, port, token = swarm.head(tmp_path / "head", "tests/trees/trials.toml", host=head, node_timeout=4.0)
    for name, host in (("alpha", alpha), ("beta", beta)):
        swarm.join(port, token, name, slots=0, head_host=head.ip, host=host, extra=["--trials", "1"])
    (tmp_path / "swarm.token").write_text(token + "\n")
    spec = tmp_path / "study.toml"
    spec.write_text(toml(study(seeds={"baseline": 2, "explore": 1}, explore={"trials": 1})))
    out = tmp_path / "study"
    controller = Proc(["research", "run", str(spec), "--dir", str(out), "--head", f"{head.ip}:{port}",
                       "--token-file", str(tmp_path / "swarm.token")], swarm.env_of(laptop), prefix=laptop.prefix)
    swarm.procs.append(controller)
    controller.wait_for(r"2 of 2 trial slots free now \(alpha: 1, beta: 1\)", 120)
    door = f"http://{head.ip}:{port + 1}"
    on_alpha = wait_until(lambda: next((t for t in door_trials(door, token)["trials"]
                                        if t["node"] == "alpha" and t["state"] == "running"), None),
                          300, interval_s=0.2, what="a trial training on alpha")
    shown = door_status(door, token)                      # `actorjet status`/`top` show the trials too
    assert shown["trials"]["capacity"]["total"] == 2 and on_alpha["trial_id"] in [
        t["trial_id"] for t in shown["trials"]["active"]], shown["trials"]
    console = Console(record=True, width=300)
    print_status(shown, console)
    text = console.export_text()
    assert "research trials" in text and on_alpha["trial_id"] in text
    swarm.kill_host(alpha)                                # the machine dies under its trial
    # Whichever the registry sees first names the loss: the missing heartbeats, or thespian's
    # notice that alpha's admin left the convention (first when the head's CPU is starved).
    controller.wait_for(r"lost \(node alpha lost: (no heartbeat|left the convention)", 120)
    said = " ".join(controller.output.split())               # (the progress console wraps long lines)
    assert re.search(r"lost \(node alpha lost: (no heartbeat for 4 s|left the convention \(stopped or "
                     r"unreachable\))\); it runs again on another node", said), said
    os.killpg(controller.popen.pid, signal.SIGKILL)         # and the laptop's controller dies too
    controller.popen.wait(10)
    again = Proc(controller.args, swarm.env_of(laptop), prefix=laptop.prefix)    # the same command resumes
    swarm.procs.append(again)
    assert again.wait_exit(600) == 0, again.output

    rows = sqlite3.connect(out / "study.sqlite").execute(
        "SELECT stage, state, attempts, run_dir FROM trials ORDER BY id").fetchall()
    assert [(stage, state, attempts) for stage, state, attempts, _ in rows] == [
        ("baseline", "done", 1), ("baseline", "done", 1), ("explore", "done", 1)]    # the lost one counted once
    assert all(run_dir.startswith(("node alpha:", "node beta:")) for *_, run_dir in rows)
    seen = door_trials(door, token)["trials"]
    lost = next(t for t in seen if t["trial_id"] == on_alpha["trial_id"])
    assert lost["state"] == "lost" and lost["reason"].startswith("node alpha lost")
    assert not [t for t in seen if t["state"] in ("starting", "running", "stopping")]     # nothing left running
    done = [t["trial_id"].rsplit("-", 1)[0] for t in seen if t["state"] == "done"]         # STUDY-tN per run
    assert sorted(done) == sorted(set(done)) and len(done) == 3, seen                      # no trial twice
    assert on_alpha["trial_id"].rsplit("-", 1)[0] in done                                   # the lost one, elsewhere
    assert all(t["node"] == "beta" for t in seen if t["state"] == "done" and t["trial_id"].startswith(
        on_alpha["trial_id"].rsplit("-", 1)[0] + "-"))
