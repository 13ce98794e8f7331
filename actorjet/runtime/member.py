"""A joined node: its own actor system as a convention member, plus the join handshake.

The member advertises capabilities (node_id, name, role, slots, research trials, cpus,
gpus) and an HMAC of its node id under the join token.  It then waits for the head's verdict through its
local NodeAgent; a wrong token or a taken name ends the join with a clear message and a
non-zero exit, and nothing is placed on the node.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from actorjet.errors import UserError
from actorjet.signing import node_auth
from actorjet.runtime import frames
from actorjet.runtime import kinds
from actorjet.runtime import messages as m
from actorjet.runtime import system
from actorjet.runtime.gpus import gpu_count
from actorjet.runtime.node import NODE_AGENT_NAME, NodeAgent


def default_state_dir(name: str) -> Path:
    return Path(os.environ.get("ACTORJET_HOME", Path.home() / ".actorjet")) / "nodes" / name


class Member:
    def __init__(self, head: str, token: str, name: str, slots: int = 1, trials: int = 0, port: int | None = None,
                 state_dir: Path | None = None, timeout_s: float = 20.0, advertise: str | None = None):
        host, _, port_text = head.rpartition(":")
        if not host or not port_text.isdigit():
            raise UserError(f"HEAD must look like HOST:PORT, got {head!r}")
        if slots < 0:
            raise UserError("--slots must be >= 0")
        if not 0 <= trials <= 64:
            raise UserError("--trials must be from 0 to 64 (research trials this node hosts at once)")
        self.head_host, self.head_port = host, int(port_text)
        self.token, self.name, self.slots, self.trials = token, name, slots, trials
        self.state_dir = Path(state_dir) if state_dir else default_state_dir(name)
        self.timeout_s = timeout_s
        self.port = port
        self.advertise = advertise
        self.asys = None
        self.agent = None
        self.node_id = f"{name}-{uuid.uuid4().hex[:8]}"

    def join(self) -> m.Admission:
        system.check_reachable(self.head_host, self.head_port, min(self.timeout_s, 10.0))
        bind = system.address_towards(self.head_host, self.head_port)   # the interface facing the head
        advertise = self.advertise or bind                                 # --advertise: e.g. port forwarding
        self.port = self.port or system.free_port(bind)
        caps = {"Admin Port": self.port, "Convention Address.IPv4": (self.head_host, self.head_port),
                "actorjet_role": "runner", "node_id": self.node_id, "name": self.name,
                "slots": self.slots, "trials": self.trials, "cpus": os.cpu_count() or 1, "gpus": gpu_count(),
                "actorjet_auth": node_auth(self.token, self.node_id)}
        os.environ["ACTORJET_TOKEN"] = self.token      # this node's runners check behaviors with it
        rejected_before = frames.rejected_on_node(self.state_dir)
        self.asys = system.start_actor_system(caps, self.state_dir / "logs", advertise, self.token, bind_ip=bind,
                                              node_dir=self.state_dir,     # runners are what nodes host; a
                                              preload=lambda: kinds.preload(["runner"]))   # model placed here imports its own
        self.agent = self.asys.createActor(NodeAgent, globalName=NODE_AGENT_NAME)
        reply = self._wait_admission(rejected_before)
        if not isinstance(reply, m.Admission):
            self.shutdown()
            raise UserError(f"the head at {self.head_host}:{self.head_port} did not admit this node "
                            f"within {self.timeout_s:g} s (is --token right? the head drops every frame it "
                            "cannot authenticate, so a wrong token looks like silence; is it an ActorJet head? are the "
                            "convention timings the same on both sides? the head must be able to connect "
                            f"back to this machine at {advertise}:{self.port}; behind NAT or a firewall, "
                            "join with --outbound and the door URL `actorjet start` printed)")
        if not reply.admitted:
            self.shutdown()
            raise UserError(f"the head refused this node: {reply.reason}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "join.json").write_text(json.dumps(
            {"pid": os.getpid(), "node_id": self.node_id, "port": self.port,
             "head": f"{self.head_host}:{self.head_port}"}))
        return reply

    def _wait_admission(self, rejected_before: int):
        """The head's verdict, or None.  A head with another token cannot send one: its answers
        (ACKs signed with its key) are frames this node drops, so a rising rejected-frame count
        while we wait means the token is wrong; say so at once rather than time out."""
        deadline = time.monotonic() + self.timeout_s
        self.asys.tell(self.agent, m.WaitAdmission(self.timeout_s))
        while time.monotonic() < deadline:
            reply = self.asys.listen(0.5)
            if isinstance(reply, m.Admission):
                return reply
            if frames.rejected_on_node(self.state_dir) > rejected_before:
                return m.Admission(False, "wrong join token (the head's answers are signed with another key)")
        return None

    def next_event(self, timeout_s: float):
        """Later verdicts (re-admission after a head restart or a network cut), or None."""
        return self.asys.listen(timeout_s)

    def leave(self) -> None:
        """Tell the head we go (it re-places our runners at once), then stop."""
        if self.asys is not None and self.agent is not None:
            self.asys.ask(self.agent, m.Leaving(self.node_id), 3)
            time.sleep(0.2)
        self.shutdown()

    def shutdown(self) -> None:
        if self.asys is not None:
            self.asys.shutdown()
            self.asys = None
        (self.state_dir / "join.json").unlink(missing_ok=True)
