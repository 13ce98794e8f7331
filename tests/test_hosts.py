"""Across hosts for real: the head, model nodes, runner nodes and client-mode users each in
their own network namespace with their own address (tests/hosts.py).  Nothing here may
reach another "host" through a shared loopback."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
import threading
import time

import psutil
import pytest

import jobs
from swarm import REPO, recorded_calls, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

def job(steps: int, eval_every: int) -> str:
    return jobs.tiny_arith(steps, group_size=8, groups_per_step=8, runner_concurrency=16, eval_every=eval_every,
                           model="lr = 1e-4\ncheckpoint_every = 1000")


CLIENT = textwrap.dedent("""
    import sys, actorjet
    gateway, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    swarm = actorjet.connect(gateway, token=token)
    for i in range(n):
        with swarm.episode(task={"question": "11+11="}, group=f"client-{i // 2}", group_size=2) as ep:
            reply = ep.client().chat.completions.create(model=ep.model(), max_tokens=4,
                                                        messages=[{"role": "user", "content": "11+11="}])
            assert reply.choices[0].message.content is not None
            ep.reward = float(i % 2)
        print("episode done", i, flush=True)
    try:
        with swarm.episode() as ep:          # an exception aborts the episode
            raise RuntimeError("agent crashed")
    except RuntimeError:
        print("aborted", flush=True)
""")


def client_mode(swarm, host, gateway, token, episodes):
    """A client-mode user script on ``host``; returns its Popen (stdout: one line per episode)."""
    return subprocess.Popen(host.prefix + [sys.executable, "-c", CLIENT, gateway, token, str(episodes)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=swarm.env_of(host), cwd=REPO)


def metrics(run):
    from actorjet.monitor.metrics import read      # (a line being written is left for the next read)
    return read(run)


def head_log(run) -> str:
    """The head's actor log (supervisors say there which child waits for which node)."""
    path = run / "logs" / "head" / "actors.log"
    return path.read_text() if path.exists() else ""

def test_runners_on_another_host_train_and_client_mode_from_a_third(swarm, network, tmp_path):
    head, worker, laptop = network.host("head"), network.host("worker"), network.host("laptop")
    (tmp_path / "job.toml").write_text(job(steps=30, eval_every=10))
    run = tmp_path / "run"
    # listening on every interface, advertising the one address other hosts can reach
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml"), "--host", "0.0.0.0",
                                       "--advertise", head.ip])
    swarm.join(port, token, "worker", slots=2, head_host=head.ip, host=worker)

    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    data = wait_until(lambda: (s := status())["models"][0]["learner_step"] >= 3 and s, 120, interval_s=1,
                      what="3 learner steps fed by the other host's runners")
    gateway = data["services"]["policy"]["gateway"]
    assert gateway.startswith(f"http://{head.ip}:"), gateway        # the reachable address
    worker_id = next(n["node_id"] for n in data["nodes"] if n["name"] == "worker")
    assert {r["node_id"] for r in data["runners"]} == {worker_id}

    user = client_mode(swarm, laptop, gateway, token, 2)             # client mode from a third host
    out, _ = user.communicate(timeout=120)
    assert user.returncode == 0, out
    assert out.count("episode done") == 2 and "aborted" in out
    wait_until(lambda: status()["aborted_by_cause"].get("client abort") == 1, 20, what="the abort counted")

    # held-out accuracy rises; `python bench/spread.py hosts`: +14.6…+28.7 points at step 30 over
    # 10 runs, 4 of them beside a busy process (spread_hosts*.json), so +5 is 9 points below the
    # worst.  Evaluated every 10 steps, it trains until one evaluation shows it, or for 30 steps.
    def evals() -> list[float]:
        return [r["accuracy"] for r in metrics(run) if r["kind"] == "eval"]
    wait_until(lambda: status()["training_finished"] or max(evals()[1:], default=0) > evals()[0] + 0.05, 240,
               interval_s=0.5, what="held-out accuracy 5 points up, or 30 learner steps")
    if status()["training_finished"]:
        wait_until(lambda: len(evals()) >= 4, 60, what="the final evaluation")
    print("held-out accuracy", evals())
    assert max(evals()[1:]) > evals()[0] + 0.05, evals()


def test_killed_gateway_returns_on_the_same_url_and_a_client_mode_user_finishes(swarm, network, tmp_path):
    head, laptop = network.host("head"), network.host("laptop")
    (tmp_path / "job.toml").write_text(job(steps=100000, eval_every=100000))
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    gateway = wait_until(lambda: status()["services"].get("policy", {}).get("gateway"), 60, what="gateway up")
    user = client_mode(swarm, laptop, gateway, token, 40)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(user.stdout), daemon=True)
    reader.start()
    wait_until(lambda: any("episode done 3" in line for line in lines), 60, what="the user's first episodes")
    os.kill(swarm.ctl(head, "pid", port, "model.policy/gateway")["pid"], signal.SIGKILL)
    assert user.wait(180) == 0, "".join(lines)                    # it retried through the restart
    reader.join(10)
    assert sum("episode done" in line for line in lines) == 40, "".join(lines)
    data = status()
    assert data["restarts"].get("root/model.policy/gateway") == 1
    assert data["services"]["policy"]["gateway"] == gateway          # the same URL after the restart


def test_a_node_that_only_connects_out_trains_through_the_door(swarm, network, tmp_path):
    head, laptop = network.host("head"), network.host("laptop")
    network.outbound_only(laptop)               # new inbound connections to the laptop are dropped
    (tmp_path / "job.toml").write_text(job(steps=12, eval_every=1000))
    run = tmp_path / "run"
    proc, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                   extra=["--config", str(tmp_path / "job.toml")])
    door = proc.wait_for(r"actorjet join --outbound (\S+)").group(1)
    assert door == f"http://{head.ip}:{port + 1}"

    # a thespian member there cannot work (the head cannot connect back), and says what to do
    member, _ = swarm.join(port, token, "member", head_host=head.ip, host=laptop, wait=False,
                           extra=["--timeout", "4"])       # it can only time out: no need to wait 15 s
    assert member.wait_exit(60) != 0
    assert "--outbound" in member.output, member.output

    # The head admitted that member and cannot reach it: packets to the laptop are dropped, so
    # each Ping is a TCP connect pending ~2 minutes.  Pinged every beat, 20 of them held every
    # send of the registry (thespian's pending-transmit limit) and training stopped: wait
    # that long before the outbound node comes (registry/nodes.py PING_GAP_MAX_S).
    time.sleep(30)
    node = swarm.outbound(door, token, "laptop", slots=2, host=laptop)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    try:
        wait_until(lambda: status()["training_finished"], 240, interval_s=0.5, what="12 learner steps via the door")
    except AssertionError as e:       # say what the node was doing (a suite run once stopped at step 6)
        raise AssertionError(f"{e}\n--- the outbound node said:\n{node.output[-4000:]}") from None
    data = status()
    assert data["models"][0]["learner_step"] == 12
    assert data["runners"] == []                     # no thespian runner anywhere: all episodes came through the door
    assert data["episodes"]["completed"] >= 12 * 8 * 8
    assert data["services"][""]["door"] == door

    bad = subprocess.run(laptop.prefix + [sys.executable, "-m", "actorjet.cli.main", "join", "--outbound", door,
                                          "--token", "wrong", "--name", "x"],
                         capture_output=True, text=True, timeout=60, env=swarm.env_of(laptop), cwd=REPO)
    assert bad.returncode != 0 and "refused" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    node.popen.send_signal(signal.SIGTERM)
    assert node.wait_exit(30) == 0
    assert "left the swarm after" in node.output


def test_a_lease_the_registry_expires_is_given_up_by_the_outbound_node_holding_it(swarm, network, tmp_path):
    """A thespian runner hears AbandonLease from the registry; an outbound node cannot be
    reached, so the door keeps the cause and the node asks for it while it holds leases."""
    head, laptop = network.host("head"), network.host("laptop")
    (tmp_path / "job.toml").write_text(jobs.tiny_arith(
        1000, group_size=2, groups_per_step=1, runner_concurrency=2, behavior="agents.flaky_arithmetic:behavior",
        train="lease_timeout_s = 3.0"))
    proc, port, token = swarm.head(tmp_path / "run", str(REPO / "supervisors" / "default.toml"), host=head,
                                   extra=["--config", str(tmp_path / "job.toml")])
    door = proc.wait_for(r"actorjet join --outbound (\S+)").group(1)
    hang = {"AJ_FLAKY_HANG": "1", "AJ_FLAKY_RAISE": "0", "AJ_FLAKY_HANG_S": "600"}   # no LLM call for 10 min
    swarm.outbound(door, token, "laptop", host=laptop, concurrency=2, env=hang)      # room for one group
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    wait_until(lambda: status()["aborted_by_cause"].get("lease expired (idle)", 0) >= 2, 90, interval_s=1,
               what="the registry expires the hanging group's lease (idle limit 3 s)")
    # the node gives up on every lease at once (its own limit is the total one, 3600 s) and
    # reports them: the registry counts each report as late (it expired the lease already)
    data = wait_until(lambda: (lambda d: d if d["groups"]["late_results_rejected"] >= d["groups"]["issued"] else None)(
        status()), 20, interval_s=1, what="the outbound node reports the leases the registry expired")
    assert data["episodes"]["completed"] == 0 and data["episodes"]["aborted"] == 2 * data["groups"]["issued"], \
        (data["groups"], data["episodes"])


MODEL_NODE_TREE = """
id = "root"
strategy = "one_for_one"
max_restarts = 20
period_s = 60
[[children]]
id = "registry"
kind = "registry"
registry = true
[[children]]
id = "model.policy"
kind = "supervisor"
placement = { node = "modelbox" }      # the model's engine, gateway and learner live there
args = { model = "policy" }
  [[children.children]]
  id = "engine"
  kind = "engine"
  [[children.children]]
  id = "gateway"
  kind = "gateway"
  [[children.children]]
  id = "learner"
  kind = "learner"
[[children]]
id = "runners"
kind = "supervisor"
strategy = "simple_one_for_one"
child_kind = "runner"
max_restarts = 1000
period_s = 60
"""


def test_a_model_subtree_on_its_own_node_trains_evaluates_and_checkpoints(swarm, network, tmp_path):
    head, modelbox, worker = network.host("head"), network.host("modelbox"), network.host("worker")
    (tmp_path / "tree.toml").write_text(MODEL_NODE_TREE)
    (tmp_path / "job.toml").write_text(job(steps=12, eval_every=6).replace(
        "checkpoint_every = 1000", "checkpoint_every = 6"))
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(tmp_path / "tree.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    wait_until(lambda: "model.policy waits for a node matching" in head_log(run), 30,
               what="the model subtree to wait for its node")              # nothing of it runs on the head
    assert "gateway" not in status()["services"].get("policy", {})
    # the model node sees neither the head's run directory nor its model cache, nor the
    # package's shipped checkpoint (hidden under empty mounts, as on an install without it):
    # it loads the model from its own cache and keeps its files in its own home.  Its cache
    # holds a copy made here, as a machine that built it earlier would (building one is
    # tests/test_zoo.py's; here it cost ~40 s of the suite's CPU)
    from actorjet.models.zoo import SHIPPED, cache_dir, tiny_arith
    cache = tmp_path / "modelbox-cache"
    shutil.copytree(tiny_arith(0), cache / "zoo" / tiny_arith(0).name)
    swarm.join(port, token, "modelbox", slots=0, head_host=head.ip, env={"ACTORJET_CACHE": str(cache)},
               prefix=modelbox.without(run, cache_dir(), SHIPPED))
    swarm.join(port, token, "worker", slots=2, head_host=head.ip, host=worker)

    wait_until(lambda: status()["training_finished"], 240, interval_s=0.5, what="12 learner steps")
    data = status()
    assert data["services"]["policy"]["gateway"].startswith(f"http://{modelbox.ip}:")
    box_home = swarm.env["ACTORJET_HOME"]
    where = {a["path"]: a["node"] for a in data["actors"]}                 # status: where each actor runs
    for path in ("model.policy/engine", "model.policy/gateway", "model.policy/learner"):
        assert where[f"root/{path}"] == "modelbox", (path, where)
    box_run = next(Path(box_home).glob("nodes/modelbox/runs/*"))
    assert sorted(p.name for p in (box_run / "checkpoints" / "policy").iterdir()) == ["step_000006", "step_000012"]
    assert not (run / "weights").exists() and not (run / "checkpoints").exists()    # the head holds no model
    assert (box_run / "episodes-policy.sqlite").exists() and not list(run.glob("episodes-*.sqlite"))   # nor its store
    rows = metrics(run)                                                  # metrics reach the head
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 13))
    evals = wait_until(lambda: len(e := [r for r in metrics(run) if r["kind"] == "eval"]) >= 3 and e, 60,
                       what="evaluations at steps 0, 6, 12")
    assert [e["step"] for e in evals] == [0, 6, 12]


PLACED_TREE = """
id = "root"
max_restarts = 20
[[children]]
id = "registry"
kind = "registry"
registry = true
[[children]]
id = "probe"
kind = "probe"
placement = { node = "alpha" }
"""


def test_a_placed_child_waits_for_its_node_and_follows_it_after_a_loss(swarm, network, tmp_path):
    head, alpha, alpha2 = network.host("head"), network.host("alpha"), network.host("alpha2")
    (tmp_path / "tree.toml").write_text(PLACED_TREE)
    _, port, token = swarm.head(tmp_path / "run", str(tmp_path / "tree.toml"), host=head, node_timeout=3)
    home_of = lambda pid: psutil.Process(pid).environ()["ACTORJET_HOME"]  # noqa: E731
    pid = lambda: swarm.ctl(head, "pid", port, "probe")["pid"]  # noqa: E731
    wait_until(lambda: "probe waits for a node matching" in head_log(tmp_path / "run"), 30,
               what="the probe to wait for a node named alpha")
    assert pid() is None                                        # no node named alpha yet: it waits
    swarm.join(port, token, "alpha", slots=0, head_host=head.ip, host=alpha)
    first = wait_until(pid, 20, what="the probe placed on alpha")
    assert home_of(first) == swarm.env_of(alpha)["ACTORJET_HOME"]
    swarm.kill_host(alpha)                                      # the machine dies
    wait_until(lambda: not any(n["alive"] for n in swarm.ctl(head, "status", port)["nodes"] if n["name"] == "alpha"),
               20, what="alpha declared lost")
    assert pid() is None
    swarm.join(port, token, "alpha", slots=0, head_host=head.ip, host=alpha2)     # a new machine, same name
    second = wait_until(pid, 20, what="the probe placed on the new alpha")
    assert home_of(second) == swarm.env_of(alpha2)["ACTORJET_HOME"]
    assert swarm.ctl(head, "status", port)["restarts"].get("root/probe") == 1


ENGINE_APART_TREE = MODEL_NODE_TREE.replace('placement = { node = "modelbox" }      # the model\'s engine, '
                                            'gateway and learner live there\n', '').replace(
    '  id = "engine"\n  kind = "engine"\n', '  id = "engine"\n  kind = "engine"\n  placement = { node = "infer" }\n')


def test_an_engine_on_another_node_than_its_learner_gets_every_version_pushed(swarm, network, tmp_path):
    """The tree puts the engine on node "infer" and the learner on the head: each weight version
    is streamed to the engine's own node (no shared files) and served from there."""
    assert 'placement = { node = "infer" }' in ENGINE_APART_TREE and "modelbox" not in ENGINE_APART_TREE
    head, infer, worker = network.host("head"), network.host("infer"), network.host("worker")
    (tmp_path / "tree.toml").write_text(ENGINE_APART_TREE)
    (tmp_path / "job.toml").write_text(job(steps=8, eval_every=1000).replace(
        "[train]", "[train]\nkeep_trajectories = true"))          # retention archives what it deletes
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(tmp_path / "tree.toml"), host=head,
                                extra=["--config", str(tmp_path / "job.toml")])
    swarm.join(port, token, "infer", slots=0, head_host=head.ip, host=infer)
    swarm.join(port, token, "worker", slots=2, head_host=head.ip, host=worker)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    wait_until(lambda: status()["training_finished"], 240, interval_s=0.5, what="8 learner steps")
    engine_pid = swarm.ctl(head, "pid", port, "model.policy/engine")["pid"]
    infer_home = swarm.env_of(infer)["ACTORJET_HOME"]
    assert psutil.Process(engine_pid).environ()["ACTORJET_HOME"] == infer_home      # on its own node
    received = sorted(p.name for p in Path(infer_home).glob("nodes/infer/runs/*/weights-received/policy/v*"))
    assert received and all(not name.endswith(".partial") for name in received)
    assert len(received) <= 3 and received[-1] == "v000008.safetensors"            # the newest three, whole
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [r["step"] for r in rows] == list(range(1, 9)) and all(r["push_s"] is not None for r in rows)
    served = {c["weight_version"] for c in recorded_calls(run, "policy")}
    assert max(served) >= 6, sorted(served)              # the engine served the versions it was pushed
