"""Joining, node loss, re-placement and head restarts with real processes.  The tests where
nodes and the head talk to each other run each on its own host (a network namespace);
refusals and CLI errors run on 127.0.0.1."""
import time

import psutil
import pytest

from actorjet.runtime import system
from actorjet.runtime.head import attach_root, status
from swarm import wait_until

pytestmark = pytest.mark.slow


def live_count(port):
    return sum(1 for p in system.system_processes(port) if system.still_running(p))


def client(port):
    return attach_root(port)


def placed(port, runner="runner-0"):
    asys, root = client(port)
    data = status(asys, root)
    names = {n["node_id"]: n["name"] for n in data["nodes"]}
    for r in data["runners"]:
        if r["id"] == runner and r["node_id"]:
            return names[r["node_id"]]
    return None


def placed_on(swarm, head, port, runner="runner-0"):
    data = swarm.ctl(head, "status", port)
    names = {n["node_id"]: n["name"] for n in data["nodes"]}
    return next((names[r["node_id"]] for r in data["runners"] if r["id"] == runner and r["node_id"]), None)


@pytest.mark.netns
def test_node_loss_is_detected_and_its_runner_replaced(swarm, network, tmp_path, trees):
    head, hosts = network.host("head"), {"alpha": network.host("alpha"), "beta": network.host("beta")}
    _, port, token = swarm.head(tmp_path / "run", str(trees / "nodes.toml"), node_timeout=3, host=head)
    swarm.join(port, token, "alpha", head_host=head.ip, host=hosts["alpha"])
    first = wait_until(lambda: placed_on(swarm, head, port), 15, what="runner placed")
    swarm.join(port, token, "beta", head_host=head.ip, host=hosts["beta"])
    wait_until(lambda: len([n for n in swarm.ctl(head, "status", port)["nodes"] if not n["head"]]) == 2, 10,
               what="both nodes admitted")
    # A starved head is not a lost node: the registry stopped (SIGSTOP) for twice the timeout
    # reads its nodes' answers late; it must not declare them lost for its own pause.
    registry = psutil.Process(swarm.ctl(head, "pid", port, "registry")["pid"])
    registry.suspend()
    time.sleep(6)
    registry.resume()
    time.sleep(2)
    data = swarm.ctl(head, "status", port)
    assert data["nodes_lost"] == 0 and all(n["alive"] for n in data["nodes"]), data["nodes"]
    killed_at = time.time()
    swarm.kill_host(hosts[first])                # the machine holding the runner dies
    survivor = "beta" if first == "alpha" else "alpha"
    wait_until(lambda: placed_on(swarm, head, port) == survivor, 12, what="runner re-placed on the survivor")
    elapsed = time.time() - killed_at
    assert elapsed <= 10, f"loss handled after {elapsed:.1f} s"
    lost = [n for n in swarm.ctl(head, "status", port)["nodes"] if n["name"] == first]
    assert lost and not lost[0]["alive"]


@pytest.mark.netns
def test_head_restart_readmits_members_and_leaves_no_orphans(swarm, network, tmp_path, trees):
    run = tmp_path / "run"
    head_host, alpha = network.host("head"), network.host("alpha")
    head, port, token = swarm.head(run, str(trees / "nodes.toml"), node_timeout=3, host=head_host)
    node, _ = swarm.join(port, token, "alpha", slots=1, head_host=head_host.ip, host=alpha)
    wait_until(lambda: placed_on(swarm, head_host, port) == "alpha", 15, what="runner placed on alpha")
    old_pid = swarm.ctl(head_host, "pid", port, "runners/runner-0")["pid"]
    count_before = len(swarm.host_processes(alpha))
    swarm.kill_host(head_host)              # the whole head machine: admin, actors, CLI
    head2, port2, token2 = swarm.head(run, str(trees / "nodes.toml"), port=port, node_timeout=3, host=head_host)
    assert token2 == token                  # same run dir → same cluster secret
    wait_until(lambda: placed_on(swarm, head_host, port) == "alpha", 30, what="member re-admitted and runner placed")
    node.wait_for("re-admitted", 10)
    new_pid = wait_until(lambda: swarm.ctl(head_host, "pid", port, "runners/runner-0")["pid"], 10)
    assert new_pid != old_pid
    # the orphan of the first head is gone, and the node has as many processes as before
    wait_until(lambda: old_pid not in [p.pid for p in swarm.host_processes(alpha)], 10, what="orphaned runner stopped")
    wait_until(lambda: len(swarm.host_processes(alpha)) <= count_before, 10, what="no extra processes on the node")


def test_wrong_token_is_refused_and_nothing_placed(swarm, tmp_path, trees):
    _, port, token = swarm.head(tmp_path / "run", str(trees / "nodes.toml"))
    proc, _ = swarm.join(port, "not-the-token", "mallory", wait=False)
    assert proc.wait_exit(30) == 2
    assert "refused this node: wrong join token" in proc.output
    data = status(*client(port))
    assert not any(n["name"] == "mallory" for n in data["nodes"])
    assert all(r["node_id"] is None for r in data["runners"])


def test_second_node_with_the_same_name_is_refused(swarm, tmp_path, trees):
    _, port, token = swarm.head(tmp_path / "run", str(trees / "nodes.toml"))
    swarm.join(port, token, "twin")
    proc, _ = swarm.join(port, token, "twin", wait=False)
    assert proc.wait_exit(30) == 2
    assert "already joined under the name 'twin'" in proc.output


def test_unreachable_head_fails_fast(swarm):
    from swarm import free_port
    t0 = time.time()
    proc, _ = swarm.join(free_port(), "x", "lonely", wait=False)
    assert proc.wait_exit(30) == 2
    assert time.time() - t0 < 15
    assert "cannot reach the head" in proc.output


def test_port_in_use_is_a_clear_error(swarm, tmp_path, trees):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        from swarm import Proc
        proc = Proc(["start", "--tree", str(trees / "nodes.toml"), "--port", str(busy),
                     "--run-dir", str(tmp_path / "run")], swarm.env)
        swarm.procs.append(proc)
        assert proc.wait_exit(60) == 2
    assert f"port {busy} is already in use" in proc.output
    assert "Traceback" not in proc.output


@pytest.mark.netns
def test_leave_replaces_runners_at_once(swarm, network, tmp_path, trees):
    head, alpha, beta = network.host("head"), network.host("alpha"), network.host("beta")
    _, port, token = swarm.head(tmp_path / "run", str(trees / "nodes.toml"), node_timeout=30, host=head)
    swarm.join(port, token, "alpha", head_host=head.ip, host=alpha)
    wait_until(lambda: placed_on(swarm, head, port) == "alpha", 15, what="runner on alpha")
    swarm.join(port, token, "beta", head_host=head.ip, host=beta)
    from swarm import Proc
    leave = Proc(["leave", "--name", "alpha"], swarm.env_of(alpha), prefix=alpha.prefix)
    assert leave.wait_exit(30) == 0, leave.output
    wait_until(lambda: placed_on(swarm, head, port) == "beta", 8, what="runner moved to beta well before the 30 s timeout")


def test_stale_system_of_a_crashed_head_is_cleaned_up_then_stop_works(swarm, tmp_path, trees):
    import os
    import signal
    run = tmp_path / "run"
    head, port, _ = swarm.head(run, str(trees / "nodes.toml"))
    import psutil
    [watcher] = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and
                 "actorjet.runtime.owner_watch" in p.info["cmdline"] and str(port) in p.info["cmdline"]]
    watcher.kill()                                   # (the watcher would end the system with the CLI:
    os.kill(head.popen.pid, signal.SIGKILL)          # test_stops.py) the CLI dies, its daemonized admin stays
    head.popen.wait(10)
    assert system.system_processes(port), "thespian's admin should have outlived the CLI"
    head2, _, _ = swarm.head(run, str(trees / "nodes.toml"), port=port)
    head2.wait_for("stopped a stale actor system left on port", 5)
    from swarm import Proc
    stop = Proc(["stop", "--run-dir", str(run)], swarm.env)
    assert stop.wait_exit(60) == 0, stop.output
    assert f"stopped the head (pid {head2.popen.pid})" in stop.output, stop.output      # says what it stopped
    assert head2.wait_exit(30) == 0
    wait_until(lambda: not system.system_processes(port), 15, what="head system gone after stop")


def test_status_prints_a_table_and_the_documented_json_keys(swarm, tmp_path, trees):
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(trees / "nodes.toml"))
    swarm.join(port, token, "alpha")
    wait_until(lambda: placed(port) == "alpha", 15, what="runner placed")
    from swarm import Proc
    as_json = Proc(["status", "--run-dir", str(run), "--json"], swarm.env)
    assert as_json.wait_exit(60) == 0, as_json.output
    import json
    data = json.loads(as_json.output)
    assert {"nodes", "runners", "models", "behaviors", "episodes", "restarts", "actors", "rejected_frames",
            "watchdog"} <= set(data)
    assert {"node_id", "name", "alive", "slots", "rejected_frames", "cpu_percent"} <= set(data["nodes"][0])
    assert {"id", "node_id", "behaviors", "state", "completed"} <= set(data["runners"][0])
    assert {"path", "node", "host", "pid", "up_s", "restarts"} <= set(data["actors"][0])
    assert {"completed", "aborted", "in_flight", "trained"} <= set(data["episodes"])
    table = Proc(["status", "--run-dir", str(run)], swarm.env)
    assert table.wait_exit(60) == 0
    assert "alpha" in table.output and "runner-0" in table.output
    missing = Proc(["status", "--head", "127.0.0.1:1"], swarm.env)
    assert missing.wait_exit(60) == 2 and "no ActorJet system is listening" in missing.output
