"""The training path end to end, with real processes: quickstart, joined nodes, client mode."""
import json
import re
import subprocess
import sys
import time

import pytest

import actorjet
from actorjet.runtime.head import attach_root, status
from swarm import REPO, wait_until

pytestmark = pytest.mark.slow


def test_quickstart_smoke_reward_rises(tmp_path):
    run = tmp_path / "qs"
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "quickstart", "--steps", "30",
                          "--run-dir", str(run)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    match = re.search(r"([\d.]+)% before → ([\d.]+)% after", out.stdout)
    assert match, out.stdout
    before, after = map(float, match.groups())
    assert after > before
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 31))
    first, last = train[:10], train[-10:]
    assert sum(r["reward_mean"] for r in last) > sum(r["reward_mean"] for r in first)
    for r in train:      # every step says what it trained on
        assert {"weight_version", "tokens", "step_time_s", "staleness_max"} <= set(r)
        assert r["staleness_max"] <= 1
    assert (run / "plots" / "reward_curve.png").stat().st_size > 1000
    head = json.loads((run / "head.json").read_text())
    from actorjet.runtime import system
    assert not system.system_processes(head["port"]), "quickstart left its actor system running"


JOB = """
[[models]]
name = "policy"
source = "tiny-arith"
lr = 1e-4
[[tasks]]
name = "arithmetic"
source = "agents.arithmetic"
behavior = "agents.arithmetic:behavior"
[train]
group_size = 4
groups_per_step = 4
steps = 100000
runner_concurrency = 16
"""


def test_runners_on_a_joined_node_and_client_mode_feed_the_learner(swarm, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), extra=["--config", str(job)])
    swarm.join(port, token, "worker", slots=1)

    def step():
        models = status(*attach_root(port))["models"]
        return models and models[0]["learner_step"] >= 3
    wait_until(step, 90, interval_s=0.5, what="3 learner steps fed by the joined node's runner")
    data = status(*attach_root(port))
    worker = next(n["node_id"] for n in data["nodes"] if n["name"] == "worker")
    assert [r["node_id"] for r in data["runners"]] == [worker]
    assert data["behaviors"][0]["runners"] >= 1

    gateway = data["services"]["policy"]["gateway"]
    done_before = data["episodes"]["completed"]
    swarm_client = actorjet.connect(gateway, token=token)
    for reward in (1.0, 0.0):
        with swarm_client.episode(task={"question": "11+11="}, group="client-g", group_size=2) as ep:
            reply = ep.client().chat.completions.create(model=ep.model(), max_tokens=4,
                                                        messages=[{"role": "user", "content": "11+11="}])
            assert reply.choices[0].message.content is not None
            ep.reward = reward
    with pytest.raises(RuntimeError):
        with swarm_client.episode() as ep:          # an exception aborts the episode
            raise RuntimeError("agent crashed")
    wait_until(lambda: status(*attach_root(port))["episodes"]["completed"] >= done_before + 2, 10)
    wait_until(lambda: status(*attach_root(port))["aborted_by_cause"].get("client abort") == 1, 10)
