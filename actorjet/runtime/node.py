"""The two small actors that tie a joined node to the head.

NodeAgent   lives on the member, created by the `actorjet join` process under a global
            name.  It hears the head's verdict (admitted or rejected), tells the join
            process, and stops runners left over from an earlier admission (orphans of a
            head that restarted, or of a network cut after which their work was re-placed).
NodeLink    is created *by the registry* on the member (placement by node_id).  It is the
            registry's heartbeat partner there and finds the NodeAgent by its global name,
            which only resolves on the member's own actor system.
"""
from __future__ import annotations


import time
from datetime import timedelta

from thespian.actors import ActorExitRequest, ActorTypeDispatcher, WakeupMessage

from actorjet.runtime import frames, load, logs
from actorjet.runtime.lineage import die_with_parent, exit_soon_after_sigterm
from actorjet.runtime import messages as m

log = logs.log
NODE_AGENT_NAME = "actorjet-node"


def on_node(capabilities: dict, requirements: dict | None) -> bool:
    """Placement rule shared by node-bound actors: the node_id must match exactly."""
    if not requirements or "node_id" not in requirements:
        return True
    return capabilities.get("node_id") == requirements["node_id"]


class NodeAgent(ActorTypeDispatcher):
    def receiveMessage(self, msg, sender):
        logs.ensure()
        super().receiveMessage(msg, sender)

    def __init__(self):
        super().__init__()
        die_with_parent()
        exit_soon_after_sigterm()
        self.waiter = None
        self.outcome: m.Admission | None = None
        self.admission = ""
        self.registry = None
        self.node_id = ""
        self.runners: dict[str, tuple[str, object]] = {}   # runner id → (admission, address)
        self.link = None

    def receiveMsg_WaitAdmission(self, msg: m.WaitAdmission, sender):
        self.waiter = sender
        if self.outcome is not None:
            self.send(sender, self.outcome)

    def receiveMsg_Introduce(self, msg: m.Introduce, sender):
        self.outcome = m.Admission(msg.admitted, msg.reason, msg.admission)
        if msg.admitted:
            log.info("%s by the head (admission %s)", "re-admitted" if self.admission else "admitted", msg.admission)
        else:
            log.warning("refused by the head: %s", msg.reason)
        if msg.admitted:
            self.admission, self.registry = msg.admission, msg.registry
            if self.link is not None and self.link != sender:
                self.send(self.link, ActorExitRequest())    # the link of a head that is gone
            self.link = sender
            for runner_id, (admission, addr) in list(self.runners.items()):
                if admission != self.admission:
                    log.info("stopping orphan runner %s of admission %s", runner_id, admission)
                    self.send(addr, ActorExitRequest())
                    del self.runners[runner_id]
        else:
            self.send(sender, ActorExitRequest())
        if self.waiter is not None:
            self.send(self.waiter, self.outcome)

    def receiveMsg_RunnerHello(self, msg: m.RunnerHello, sender):
        if self.admission and msg.admission != self.admission:
            self.send(sender, ActorExitRequest())   # placed by a head that is gone
            return
        self.runners[msg.runner_id] = (msg.admission, sender)

    def receiveMsg_Leaving(self, msg: m.Leaving, sender):
        if self.registry is not None:
            self.send(self.registry, msg)
        self.send(sender, m.Admission(False, "left"))

    def receiveMsg_Ping(self, msg: m.Ping, sender):
        import os
        self.send(sender, m.Pong(msg.nonce, os.getpid(), {"runners": sorted(self.runners),
                                                          "admission": self.admission}))


SILENCE_S = 5.0      # no heartbeat from the head for this long: say so in the node's log


class NodeLink(ActorTypeDispatcher):
    """Also the node's witness of the head: a gap in its heartbeats (head lost, network cut)
    and their return are written to the node's own log, so an operator on the node sees it."""

    def __init__(self):
        super().__init__()
        die_with_parent()
        exit_soon_after_sigterm()

    def receiveMessage(self, msg, sender):
        logs.ensure()
        super().receiveMessage(msg, sender)

    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        return on_node(capabilities, requirements)

    def receiveMsg_Introduce(self, msg: m.Introduce, sender):
        agent = self.createActor(NodeAgent, globalName=NODE_AGENT_NAME)
        self.send(agent, msg)     # on refusal the agent sends us away once it has the verdict
        if not hasattr(self, "last_ping"):
            self.last_ping, self.silent = time.monotonic(), False
            self.wakeupAfter(timedelta(seconds=1.0))

    def receiveMsg_Ping(self, msg: m.Ping, sender):
        if getattr(self, "silent", False):
            log.info("heartbeats from the head again after %.0f s", time.monotonic() - self.last_ping)
        self.last_ping, self.silent = time.monotonic(), False
        self.send(sender, m.Pong(msg.nonce, 0, {"rejected_frames": frames.rejected_on_node(), "load": load.here()}))

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        quiet = time.monotonic() - self.last_ping
        if quiet > SILENCE_S and not self.silent:
            self.silent = True
            log.warning("no heartbeat from the head for %.0f s: the head is down or the network is cut; "
                        "this node keeps trying to reach it", quiet)
        self.wakeupAfter(timedelta(seconds=1.0))
