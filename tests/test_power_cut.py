"""A whole-cluster power cut: every process of the head and of its node SIGKILLed at once in
the middle of training, then `actorjet start` with the same run directory and the node's
`join` again.  Training resumes from the newest checkpoint and finishes; every group the
surviving weights saw was trained once; the node's runners are admitted again; status says
what was recovered.  Each machine is its own host (a network namespace, tests/hosts.py)."""
import json

import pytest
from rich.console import Console

import jobs
from actorjet.cli.tables import print_status
from actorjet.store.episode_store import EpisodeStore
from swarm import REPO, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

STEPS, GROUPS, EVERY = 14, 4, 4
JOB = jobs.tiny_arith(STEPS, groups_per_step=GROUPS, model=f"checkpoint_every = {EVERY}\neval_at_start = false")


def test_power_cut_of_every_machine_mid_step_resumes_from_the_checkpoint(swarm, network, tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    run, tree = tmp_path / "run", str(REPO / "supervisors" / "default.toml")
    head, node = network.host("head"), network.host("a")
    extra = ["--config", str(tmp_path / "job.toml")]
    _, port, token = swarm.head(run, tree, host=head, extra=extra)
    swarm.join(port, token, "a", slots=2, head_host=head.ip, host=node)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    step = lambda: status()["models"][0]["learner_step"]  # noqa: E731
    wait_until(lambda: step() >= EVERY + 2, 120, interval_s=0.2, what=f"learner step {EVERY + 2}")
    seen = step()
    killed = swarm.kill_host(head) + swarm.kill_host(node)          # the power goes, everywhere at once
    assert len(killed) >= 6, killed                                  # CLI, admin, actors; node, runners

    swarm.head(run, tree, port=port, host=head, extra=extra)
    swarm.join(port, token, "a", slots=2, head_host=head.ip, host=node)
    wait_until(lambda: status()["recovered"].get("policy"), 60, interval_s=0.2, what="the learner resumed")
    recovered = status()["recovered"]["policy"]
    checkpointed = [int(p.name[5:]) for p in (run / "checkpoints" / "policy").glob("step_*")]
    assert recovered["step"] % EVERY == 0 and EVERY <= recovered["step"] <= max(checkpointed), recovered
    assert recovered["step"] <= seen + 1 or recovered["step"] == max(checkpointed), (recovered, seen)
    # what was trained after the checkpoint (at least the steps seen) is pending again
    assert recovered["pending_again"] >= (seen - recovered["step"]) * GROUPS, (recovered, seen)
    console = Console(record=True, width=240)
    print_status(status(), console)                                  # and `actorjet status` says it
    assert f"recovered: policy resumed at step {recovered['step']} as weights v" in console.export_text()
    wait_until(lambda: status()["training_finished"], 240, interval_s=0.5, what=f"{STEPS} learner steps")
    data = status()
    assert data["models"][0]["learner_step"] == STEPS
    # eval_at_start = false: neither the starting weights nor the checkpoint the learner resumed
    # were scored; the end was (the run is finished only once its last evaluation reported)
    evals = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("kind") == "eval"]
    assert evals == [STEPS], evals
    assert [n["name"] for n in data["nodes"] if not n["head"] and n["alive"]] == ["a"]     # re-admitted
    assert all(r["node_id"] for r in data["runners"]) and sum(r["completed"] for r in data["runners"]) > 0

    # The surviving weights saw each step's batch once: as many trained groups as steps x groups
    # (a group trained before the cut and again after it would count once, its step rewound),
    # and no step trained more than one batch (retention retires what it may: steps shrink).
    store = EpisodeStore(run / "episodes-policy.sqlite")
    counts = store.counts()
    assert counts["trained"] == STEPS * GROUPS, counts
    assert counts["complete"] == counts["trained"] + counts["pending"] + counts["quarantined"]
    per_step = dict(store.db.execute("SELECT trained_step, COUNT(*) FROM groups WHERE trained_step IS NOT NULL "
                                     "GROUP BY trained_step").fetchall())
    assert all(s <= STEPS and n <= GROUPS for s, n in per_step.items()), per_step
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert train_steps[-1] == STEPS and recovered["step"] + 1 in train_steps[train_steps.index(seen) + 1:]

    # Another cut once training has finished: the run started again says so at once (its
    # learner resumes at the last step; it reported nothing before, and status waited forever).
    swarm.kill_host(head)
    swarm.head(run, tree, port=port, host=head, extra=extra)
    wait_until(lambda: status()["training_finished"], 60, interval_s=0.2, what="the finished run to say so")
    assert status()["models"][0]["learner_step"] == STEPS and status()["recovered"]["policy"]["step"] == STEPS
