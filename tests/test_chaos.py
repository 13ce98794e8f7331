"""Chaos: a real training run on two joined nodes while runners, a whole node, the gateway
and the learner are killed and the agent's environment raises and hangs.  Training reaches
its steps, every group is accounted for, nothing is trained twice, and held-out accuracy still rises.
The head and every node run on their own host (a network namespace, tests/hosts.py)."""
import json
import os
import signal

import pytest

from actorjet.store.episode_store import EpisodeStore
from actorjet.store.trajectories import archived, stored
import jobs
from swarm import REPO, complete_groups, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

STEPS = 40
JOB = jobs.tiny_arith(STEPS, group_size=8, groups_per_step=8, runner_concurrency=16,
                      behavior="agents.flaky_arithmetic:behavior", model="lr = 1e-4\ncheckpoint_every = 5",
                      train="lease_timeout_s = 4.0\nepisode_retries = 3\nkeep_trajectories = true")


def test_training_survives_killed_runners_node_gateway_and_learner(swarm, network, tmp_path):
    """Every node is its own host (network namespace); node a dies with all its processes."""
    swarm.env.update(AJ_FLAKY_RAISE="0.05", AJ_FLAKY_HANG="0.01", AJ_FLAKY_HANG_S="20")
    (tmp_path / "job.toml").write_text(JOB)
    run = tmp_path / "run"
    head, host_a, host_b, host_c = (network.host(n) for n in ("head", "a", "b", "c"))
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    swarm.join(port, token, "a", slots=2, head_host=head.ip, host=host_a)
    swarm.join(port, token, "b", slots=2, head_host=head.ip, host=host_b)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    step = lambda: status()["models"][0]["learner_step"]  # noqa: E731
    pid_of = lambda path: swarm.ctl(head, "pid", port, path)["pid"]  # noqa: E731
    faults = []

    def after(n, what):
        wait_until(lambda: step() >= n, 120, interval_s=0.3, what=f"learner step {n} before {what}")
        faults.append(what)

    after(3, "kill a runner")
    os.kill(pid_of("runners/runner-b-0"), signal.SIGKILL)
    after(8, "kill the gateway")          # it writes the episode store: nothing it wrote may be lost
    os.kill(pid_of("model.policy/gateway"), signal.SIGKILL)
    after(13, "kill the learner")
    os.kill(pid_of("model.policy/learner"), signal.SIGKILL)
    after(18, "kill node a")
    assert swarm.kill_host(host_a)
    swarm.join(port, token, "c", slots=2, head_host=head.ip, host=host_c)   # a replacement node joins
    after(22, "kill a runner again")
    os.kill(pid_of("runners/runner-c-1"), signal.SIGKILL)

    wait_until(lambda: status()["training_finished"], 300, interval_s=0.5, what=f"{STEPS} learner steps")
    # Quiescent before counting: runners still finish the groups they hold when training ends
    # (no new leases then).
    snapshot = {}

    def quiet() -> bool:
        snapshot.update(status())
        return snapshot["groups"]["leases_open"] == 0
    wait_until(quiet, 60, interval_s=0.5, what="no lease open")
    data = snapshot
    assert data["models"][0]["learner_step"] == STEPS
    assert data["restarts"].get("root/model.policy/learner", 0) >= 1
    assert data["restarts"].get("root/model.policy/gateway", 0) >= 1
    assert data["nodes_lost"] >= 1

    # the store judges groups: every group complete in it (retired ones included) is in
    # groups.jsonl once (its gateway tells the head each second until the head says it wrote
    # it down; the gateway was SIGKILLed on the way), and the registry only leased them.
    complete = complete_groups(run, "policy")
    trained = EpisodeStore(run / "episodes-policy.sqlite").counts()["trained"]
    read_log = lambda: [json.loads(line)["group_id"] for line in (run / "groups.jsonl").read_text().splitlines()]  # noqa: E731
    logged = wait_until(lambda: (lambda ids: ids if set(ids) >= complete else None)(read_log()), 10,
                        what="groups.jsonl to catch up with the store")
    assert len(logged) == len(set(logged)) and set(logged) == complete
    # "Done" is the store's word alone: status's groups.finished is the store's complete count
    # (the gateway tells it each second), never a count the registry keeps.
    store_complete = EpisodeStore(run / "episodes-policy.sqlite").counts()["complete"]     # retired included
    data = wait_until(lambda: (lambda d: d if d["groups"]["finished"] == store_complete else None)(status()), 10,
                      what=f"status's finished groups to be the store's {store_complete}")
    assert trained >= STEPS * 8 - 8 * 5     # at most one checkpoint interval was rewound and not redone
    members: dict[str, set] = {}      # complete group → its members with recorded calls (store + archive)
    for path, read in ((run / "trajectories" / "policy.jsonl", archived), (run / "episodes-policy.sqlite", stored)):
        for episode, calls in read(path):
            if episode["group_id"] in complete and calls:
                members.setdefault(episode["group_id"], set()).add(episode["member"])
    assert members and all(len(m) == 8 for m in members.values())       # whole groups, each with its calls
    # the counters in status agree with the store (a rewound group is not counted twice)
    trained_episodes = EpisodeStore(run / "episodes-policy.sqlite").counts()["episodes_trained"]
    assert data["episodes"]["trained"] == trained_episodes
    # every issued group is complete in the store, dropped with a cause, or still open; none is
    # lost.  A runner that died after storing a group's rewards and before reporting them leaves
    # that group complete in the store and open (re-leased) in the registry: both, hence ≤.
    g = data["groups"]
    assert g["finished"] <= g["issued"] <= g["finished"] + g["dropped"] + g["groups_open"]
    assert sum(g["dropped_by_cause"].values()) == g["dropped"]
    assert data["aborted_by_cause"].get("behavior error", 0) > 0      # the injected faults happened
    assert data["episodes"]["requeued"] > 0

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # it still learns: held-out greedy accuracy (512 problems; the learner evaluates at its
    # start, after its restart, and at the end) rises.  Sampled reward over 40 small steps is
    # too noisy to show it reliably (a run once gave thirds of 0.28 and 0.26).  The margin is
    # set from `python bench/spread.py chaos` from the shipped checkpoint (0.318): gains of
    # +16.8…+24.0 points over 6 runs on a quiet machine and +12.3…+21.1 over 4 runs beside a
    # busy process (bench/results/spread_chaos*.json), so +5 is 7 points below the worst run.
    evals = [r["accuracy"] for r in rows if r["kind"] == "eval"]
    assert len(evals) >= 2 and evals[-1] > evals[0] + 0.05, evals
    print("faults:", faults, "aborted:", data["aborted_by_cause"], "groups:", g)


def test_environment_and_engine_faults_stay_local(swarm, network, tmp_path):
    """Behaviors that kill their runner process or leak past the memory limit cost only their
    own runner a restart; an engine crash is restarted and the agents' clients retry."""
    swarm.env.update(AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="0", AJ_FLAKY_EXIT="0.004", AJ_FLAKY_LEAK_MB="4")
    job = JOB.replace(f"steps = {STEPS}", "steps = 14").replace("runner_concurrency = 16",
                                                                  "runner_concurrency = 8\nrunner_memory_mb = 450.0")
    (tmp_path / "job.toml").write_text(job)
    run = tmp_path / "run"
    head, host_a = network.host("head"), network.host("a")
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    swarm.join(port, token, "a", slots=2, head_host=head.ip, host=host_a)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 4, 120, interval_s=0.3, what="4 steps")
    os.kill(swarm.ctl(head, "pid", port, "model.policy/engine")["pid"], signal.SIGKILL)
    wait_until(lambda: status()["training_finished"], 300, interval_s=0.5, what="14 learner steps")
    data = status()
    causes = data["aborted_by_cause"]
    assert causes.get("runner died", 0) > 0, causes                 # os._exit inside a behavior
    assert causes.get("runner restarted", 0) > 0, causes            # the memory limit
    assert data["restarts"].get("root/model.policy/engine") == 1
    runner_restarts = {k: v for k, v in data["restarts"].items() if k.startswith("root/runners/")}
    assert sum(runner_restarts.values()) >= 2
    assert not {k for k in data["restarts"] if not k.startswith(("root/runners/", "root/model.policy/engine"))}
    swarm_rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    swarm_lines = [r for r in swarm_rows if r["kind"] == "swarm"]        # the counters, per learner step
    assert [r["step"] for r in swarm_lines][-1] == 14
    assert {"episodes", "aborted_by_cause", "groups", "restarts", "nodes_lost"} <= set(swarm_lines[-1])
