"""Multi-task cocktail training: isolated task runtimes, mixing weights, tasks changed live.
The head and the runners' node each run on their own host (a network namespace)."""
import json
import sqlite3
import subprocess
import sys

import pytest

from swarm import REPO, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

JOB = """
[[models]]
name = "policy"
source = "tiny-arith"
eval_every = 1000
[[tasks]]
name = "healthy"
source = "agents.arithmetic"
behavior = "agents.arithmetic:behavior"
weight = {w_healthy}
[[tasks]]
name = "{other}"
source = "agents.arithmetic"
behavior = "{other_behavior}"
weight = {w_other}
[train]
group_size = 8
groups_per_step = 8
steps = 100000
runner_concurrency = 16
isolation = "process"
mix = "{mix}"
"""


def start(swarm, network, tmp_path, **fields):
    (tmp_path / "job.toml").write_text(JOB.format(**fields))
    run = tmp_path / "run"
    head, worker = network.host("head"), network.host("worker")
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    swarm.join(port, token, "worker", slots=2, head_host=head.ip, host=worker)
    return run, head, lambda: swarm.ctl(head, "status", port)


def test_a_task_that_crashes_its_process_never_aborts_the_other_task(swarm, network, tmp_path):
    swarm.env.update(AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="0", AJ_FLAKY_EXIT="0.15")
    run, head, status = start(swarm, network, tmp_path, w_healthy=1.0, w_other=1.0, other="crashy",
                              other_behavior="agents.flaky_arithmetic:behavior", mix="fill")
    wait_until(lambda: status()["tasks"]["healthy"]["completed"] >= 240, 240, interval_s=1,
               what="240 episodes of the healthy task")
    tasks = status()["tasks"]
    assert tasks["crashy"]["aborted_by_cause"].get("task worker died", 0) > 0      # it did crash
    assert tasks["healthy"]["aborted_by_cause"] == {}                            # and nothing else did
    assert status()["restarts"] == {} or all("runners" not in k for k in status()["restarts"])
    # fill: never starved.  Waited for, not read at once: the registry may count a group's episodes
    # completed before the learner's Trained for it arrives (seen once: step 2 with 240 completed).
    wait_until(lambda: status()["models"][0]["learner_step"] >= 3, 60, interval_s=1, what="learner step 3")


def test_batches_follow_the_mixing_weights_and_tasks_change_while_training(swarm, network, tmp_path):
    run, head, status = start(swarm, network, tmp_path, w_healthy=3.0, w_other=1.0, other="minor",
                              other_behavior="agents.arithmetic:behavior", mix="strict")
    wait_until(lambda: status()["models"][0]["learner_step"] >= 8, 240, interval_s=1, what="8 steps")
    db = sqlite3.connect(run / "episodes-policy.sqlite")
    per_batch = {}          # one batch per learner step
    for step, task in db.execute("SELECT trained_step, task_name FROM groups WHERE trained_step IS NOT NULL"):
        per_batch.setdefault(step, []).append(task)
    assert sum(len(v) for v in per_batch.values()) * 8 >= 200          # ≥ 200 episodes trained
    for tasks in per_batch.values():                                     # strict: every batch is 6 + 2
        assert sorted(tasks).count("healthy") == 6 and tasks.count("minor") == 2, tasks

    def task(*args):
        out = subprocess.run(head.prefix + [sys.executable, "-m", "actorjet.cli.main", "task", *args,
                                            "--run-dir", str(run)],
                             capture_output=True, text=True, timeout=60, cwd=REPO, env=swarm.env_of(head))
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "paused" in task("pause", "minor")
    issued = status()["tasks"]["minor"]["issued"]
    wait_until(lambda: status()["models"][0]["learner_step"] >= 12, 120, interval_s=1)   # strict, one task: goes on
    assert status()["tasks"]["minor"]["issued"] == issued
    task("add", "extra", "--source", "agents.arithmetic", "--behavior", "agents.arithmetic:behavior")
    wait_until(lambda: status()["tasks"]["extra"]["completed"] >= 16, 120, interval_s=1, what="the added task runs")
    task("remove", "extra")
    assert "extra" not in status()["tasks"]
    out = subprocess.run(head.prefix + [sys.executable, "-m", "actorjet.cli.main", "task", "pause", "nope",
                                        "--run-dir", str(run)],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=swarm.env_of(head))
    assert out.returncode == 2 and "no task named 'nope'" in out.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("healthy" in r.get("by_task", {}) for r in rows if r["kind"] == "train")
