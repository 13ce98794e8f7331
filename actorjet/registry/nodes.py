"""Membership bookkeeping: who joined, with which capabilities, and who is still alive.

Kept free of thespian so the rules (token check, one live node per name, timeouts) are
plain functions a test can call directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from actorjet.signing import node_auth, same

# An unanswered node is pinged less and less often, up to this gap.  A ping to a host that
# drops packets silently (a cut, a firewall, an outbound-only laptop) is a TCP connect that
# stays pending ~2 minutes, and thespian holds every send of the registry once 20 transmits are
# pending: pinged every beat, one such node muted the registry (its Leases to the door) within
# 20 s.  Backed off, it holds ~15 at most; an answering node is still pinged every beat.
PING_GAP_MAX_S = 8.0


@dataclass
class Node:
    node_id: str
    name: str
    slots: int
    cpus: int = 0
    gpus: int = 0
    trials: int = 0                # research trial heads it hosts at once (join --trials)
    is_head: bool = False
    alive: bool = True
    link: object = None            # NodeLink address on that node
    admission: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    lost_reason: str = ""
    joined_at: float = field(default_factory=time.time)
    rejected_frames: int = 0       # actor frames that node dropped unauthenticated (runtime/frames.py)
    load: dict = field(default_factory=dict)   # cpu_percent, memory_percent (runtime/load.py)
    trial_host: object = None      # its TrialHost actor, once a trial was placed there
    ping_at: float = 0.0           # monotonic time of its next Ping (NodeTable.to_ping)
    ping_gap: float = 0.0          # grows while Pings go unanswered, back to one beat on a Pong

    def public(self) -> dict:
        return {"node_id": self.node_id, "name": self.name, "alive": self.alive,
                "slots": self.slots, "cpus": self.cpus, "gpus": self.gpus, "trials": self.trials,
                "head": self.is_head, "lost_reason": self.lost_reason, "rejected_frames": self.rejected_frames,
                **self.load}


class NodeTable:
    def __init__(self, token: str, node_timeout_s: float):
        self.token, self.node_timeout_s = token, node_timeout_s
        self.nodes: dict[str, Node] = {}
        self.lost_count = 0
        self.listeners: dict[str, object] = {}      # who hears NodeUp / NodeLost: its tree path → address

    def listen(self, path: str, address) -> None:
        """A supervisor that places children hears of every node that comes and goes.  Kept by
        its path in the tree, so a restarted one (placed again after its node was lost) replaces
        its old incarnation: a send to a dead actor on a lost node is a TCP connect pending for
        minutes, and thespian holds every send of the registry once 20 are pending."""
        self.listeners[path if isinstance(path, str) and path else str(address)] = address

    def check(self, caps: dict) -> str:
        """Return '' if ``caps`` may join, else the reason it may not."""
        node_id, name = caps.get("node_id"), caps.get("name")
        if not node_id or not name:
            return "not an ActorJet node (no node_id/name capability)"
        if not same(str(caps.get("actorjet_auth", "")), node_auth(self.token, node_id)):
            return "wrong join token"
        for other in self.nodes.values():
            if other.name == name and other.alive and other.node_id != node_id:
                return f"a live node is already joined under the name {name!r}; use --name"
        return ""

    def admit(self, caps: dict, admission: str, is_head: bool = False) -> Node:
        node = Node(node_id=caps["node_id"], name=caps["name"], slots=int(caps.get("slots", 0)),
                    cpus=int(caps.get("cpus", 0)), gpus=int(caps.get("gpus", 0)), trials=int(caps.get("trials", 0)),
                    is_head=is_head, admission=admission)
        self.nodes[node.node_id] = node
        return node

    def seen(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is not None:
            node.last_seen = time.monotonic()
            node.ping_at, node.ping_gap = 0.0, 0.0

    def to_ping(self, beat_s: float, now: float | None = None) -> list[Node]:
        """The nodes to ping at this heartbeat: every node with a link (lost ones too: they may
        come back) whose Pings are answered, and an unanswered one at doubling gaps up to
        PING_GAP_MAX_S (see there)."""
        now = time.monotonic() if now is None else now
        due = [n for n in self.nodes.values() if n.link is not None and n.ping_at <= now]
        for n in due:
            n.ping_gap = min(PING_GAP_MAX_S, max(beat_s, 2 * n.ping_gap))
            n.ping_at = now + n.ping_gap - beat_s / 2       # (half a beat: a beat is never exact)
        return due

    def mark_lost(self, node_id: str, reason: str) -> Node | None:
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return None
        node.alive, node.lost_reason = False, reason
        self.lost_count += 1
        return node

    def excuse(self, late_s: float) -> None:
        """The registry itself ran ``late_s`` behind (its process starved of CPU, paused, or its
        mailbox backed up): the answers it could not read meanwhile are not the nodes' fault,
        so nobody is declared lost for that time."""
        for n in self.nodes.values():
            n.last_seen += late_s

    def overdue(self) -> list[Node]:
        """Alive member nodes whose heartbeat is older than the timeout."""
        now = time.monotonic()
        return [n for n in self.nodes.values()
                if n.alive and not n.is_head and now - n.last_seen > self.node_timeout_s]

    def alive(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.alive]
