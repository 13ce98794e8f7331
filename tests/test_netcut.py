"""A member in its own network namespace: cutting its link makes the head re-place its
work; restoring the link lets it rejoin (and it stops the runner that was re-placed)."""
import contextlib
import os
import random
import shutil
import subprocess

import pytest

from actorjet.runtime.head import attach_root, status
from swarm import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def island():
    """A namespace joined to the root namespace by a veth pair; yields its addresses."""
    why = None
    if shutil.which("ip") is None:
        why = "iproute2 (`ip`) is not installed"
    elif os.geteuid() != 0:
        why = "`ip netns` needs root"
    tag = f"aj{os.getpid() % 10000}{random.randint(0, 99)}"
    ns, host_if, ns_if = f"{tag}ns", f"{tag}h", f"{tag}n"
    subnet = f"10.213.{random.randint(1, 250)}"
    if why is None:
        probe = _ip("netns", "add", ns, check=False)
        if probe.returncode != 0:
            why = f"`ip netns add` failed: {probe.stderr.strip()}"
    if why is not None:
        print(f"SKIP network-cut test: {why}")
        pytest.skip(why)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{subnet}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", ns_if)
        _ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _wait_usable(f"{subnet}.1")
        yield {"ns": ns, "host_if": host_if, "head_ip": f"{subnet}.1"}
    finally:
        with contextlib.suppress(Exception):
            _ip("link", "del", host_if, check=False)
        _ip("netns", "del", ns, check=False)


def _wait_usable(address: str, timeout_s: float = 10.0) -> None:
    """The new address accepts a listening socket (the link can take a moment to settle)."""
    import socket
    import time
    deadline = time.time() + timeout_s
    while True:
        try:
            with socket.socket() as s:
                s.bind((address, 0))
                s.listen()
                with socket.create_connection(s.getsockname(), timeout=1):
                    return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def nodes(port):
    return {n["name"]: n for n in status(*attach_root(port))["nodes"]}


def runner_node(port):
    data = status(*attach_root(port))
    names = {n["node_id"]: n["name"] for n in data["nodes"]}
    placed = [names[r["node_id"]] for r in data["runners"] if r["node_id"]]
    return placed[0] if len(placed) == 1 else None


def test_network_cut_replaces_work_and_restore_rejoins(swarm, tmp_path, trees, island):
    _, port, token = swarm.head(tmp_path / "run", str(trees / "nodes.toml"), node_timeout=3,
                                extra=["--host", island["head_ip"]])
    node, _ = swarm.join(port, token, "island", head_host=island["head_ip"],
                         prefix=["ip", "netns", "exec", island["ns"]])
    wait_until(lambda: runner_node(port) == "island", 20, what="runner on island")
    swarm.join(port, token, "mainland", head_host=island["head_ip"])
    wait_until(lambda: "mainland" in nodes(port), 10, what="mainland admitted")

    _ip("link", "set", island["host_if"], "down")                      # cut
    import time
    time.sleep(6)                                                      # longer than the node's SILENCE_S
    wait_until(lambda: runner_node(port) == "mainland", 10, what="work re-placed on mainland")
    assert not nodes(port)["island"]["alive"]

    _ip("link", "set", island["host_if"], "up")                        # restore
    wait_until(lambda: nodes(port)["island"]["alive"], 30, what="island rejoined")
    log = tmp_path / "home" / "nodes" / "island" / "logs" / "actors.log"
    wait_until(lambda: "stopping orphan runner runner-0" in log.read_text(), 15,
               what="island to stop its stale runner")
    text = log.read_text()                # the node says what happened, in its own log
    assert "no heartbeat from the head" in text and "re-admitted by the head" in text
    assert runner_node(port) == "mainland"                             # exactly one runner
