"""Separate "hosts" on one machine: each a network namespace with its own loopback and its
own address on a private bridge (docs/architecture.md, "Hosts share nothing").

    net = Network()                 # a bridge in the root namespace, a fresh /24
    head = net.host("head")         # namespace + veth + address, e.g. 10.215.7.2
    head.prefix                     # ["ip", "netns", "exec", ns]: run a process "on" it
    net.outbound_only(laptop)       # drop new inbound connections there (nftables)
    net.cut(node) / net.restore(node)
    net.close()                     # namespaces, links, bridge: gone

The test process itself sits in the root namespace, reachable at ``net.gateway_ip``: it plays
an operator's laptop on the same network, never a process on any of the hosts.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "`ip netns` needs root"
    probe = f"ajprobe{os.getpid() % 100000}"
    out = _ip("netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"`ip netns add` failed: {out.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    link: str                      # the root-side end of its veth (cut = set it down)
    env: dict = field(default_factory=dict)

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def without(self, *paths) -> list[str]:
        """A prefix like ``prefix`` whose processes also cannot see ``paths`` (each is covered by
        an empty tmpfs in a private mount namespace): files of another host stay out of reach."""
        script = 'n=$1; shift; i=0; while [ $i -lt $n ]; do mount -t tmpfs tmpfs "$1"; shift; i=$((i+1)); done; exec "$@"'
        return self.prefix + ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                              str(len(paths)), *map(str, paths)]

    def run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix + args, capture_output=True, text=True, **kwargs)


class Network:
    def __init__(self):
        self.tag = f"aj{os.getpid() % 1000}{random.randint(0, 999)}"
        self.subnet = _free_subnet()
        self.bridge = f"{self.tag}br"
        self.gateway_ip = f"{self.subnet}.1"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def host(self, name: str) -> Host:
        n = len(self.hosts) + 2
        ns, outside, inside = f"{self.tag}{name[:6]}", f"{self.tag}h{n}", f"{self.tag}n{n}"
        _ip("netns", "add", ns)
        host = Host(name, ns, f"{self.subnet}.{n}", outside)
        self.hosts.append(host)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("link", "set", outside, "master", self.bridge, "up")
        for cmd in (["addr", "add", f"{host.ip}/24", "dev", inside], ["link", "set", inside, "up"],
                    ["link", "set", "lo", "up"], ["route", "add", "default", "via", self.gateway_ip]):
            _ip("netns", "exec", ns, "ip", *cmd)
        _wait_reachable(host)
        return host

    def outbound_only(self, host: Host) -> None:
        """New inbound connections to ``host`` are dropped; it can still connect out."""
        if shutil.which("nft") is None:
            import pytest
            print("SKIP outbound-only test: nftables (`nft`) is not installed")
            pytest.skip("nftables (`nft`) is not installed (.ci/run installs it)")
        rules = ("table inet ajfw {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
                 "  iif lo accept\n  ct state established,related accept\n  ct state new drop\n }\n}\n")
        out = host.run(["nft", "-f", "-"], input=rules)
        if out.returncode != 0:
            raise RuntimeError(f"nft failed: {out.stderr.strip()}")

    def cut(self, host: Host) -> None:
        _ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.link, "up")

    def close(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                _ip("link", "del", host.link, check=False)
            _ip("netns", "del", host.ns, check=False)
        _ip("link", "del", self.bridge, check=False)


def _free_subnet() -> str:
    """A 10.X.Y/24 no address of this machine is in yet: the suite's workers and the benches
    they start each make networks at once, and two bridges on one subnet would route one
    swarm's packets to the other's hosts (a drawn subnet was never checked before)."""
    taken = {".".join(word.split("/")[0].split(".")[:3])
             for word in _ip("-o", "-4", "addr", "show").stdout.split() if word.startswith("10.")}
    while True:
        subnet = f"10.{random.randint(200, 250)}.{random.randint(1, 250)}"
        if subnet not in taken:
            return subnet


def _wait_reachable(host: Host, timeout_s: float = 10.0) -> None:
    """The new address answers from the root namespace (a link can take a moment)."""
    deadline = time.time() + timeout_s
    script = ("import socket,sys;s=socket.socket();s.bind((sys.argv[1],0));s.listen();"
              "print(s.getsockname()[1],flush=True);s.accept()")
    server = subprocess.Popen(host.prefix + ["python3", "-c", script, host.ip], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        while True:
            try:
                with socket.create_connection((host.ip, port), timeout=1):
                    return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        server.kill()
        server.wait()
