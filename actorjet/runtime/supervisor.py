"""The supervisor actor: starts children from a spec and keeps them alive, OTP style.

Restart types:  permanent (always restarted), transient (restarted unless it said it was
stopping normally), temporary (never restarted).
Strategies:     one_for_one (only the failed child), one_for_all (every child),
                rest_for_one (the failed child and the children started after it).
Intensity:      more than ``max_restarts`` restarts within ``period_s`` → the supervisor
                stops its children, tells its parent (``Escalated``) and exits; its parent
                then treats that as a failure of its own child.  At the root, the head
                process is told and exits with a clear message.
Backoff:        a child that ran for at least a second is restarted at once (fast recovery
                matters most); one that keeps dying within a second of its start is in a
                crash loop, and its k-th quick death waits ``backoff_initial_s * 2**(k-1)``
                (0.05 s if unset), capped at ``backoff_max_s``.

Placement:      a child with ``placement = { node = "gpu1" }`` and/or ``{ gpus = 1, cpus = 8 }``
                starts on an admitted live node that matches (the head counts as a node; the
                one with the fewest children of this supervisor wins), or waits, without
                counting as a restart, until such a node joins.  Its own children start
                where it runs.  A model subtree placed on a GPU node serves, records and
                trains there.
Children on *other nodes* are not reported dead by thespian when their node dies; the
supervisor of a placed child subscribes to the registry's NodeUp / NodeLost events and
treats the loss of its node as the child's failure (restarted on another match, or waiting).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from datetime import timedelta

from thespian.actors import ActorExitRequest, ChildActorExited, WakeupMessage

from actorjet.runtime import kinds
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.spec import ChildSpec

log = logging.getLogger("actorjet")


class Supervisor(ManagedActor):
    def on_init(self) -> None:
        self.spec = ChildSpec.from_dict(self.args["spec"])
        self.inherited = {k: v for k, v in self.args.items() if k != "spec"}
        self.addresses: dict[str, object] = {}     # child id → live address
        self.gone: set[str] = set()                # temporary children that ended
        self.normal_exit: set[str] = set()
        self.recent: deque[float] = deque()        # restart times inside the period
        self.started_at: dict[str, float] = {}
        self.quick_deaths: dict[str, int] = {}     # consecutive deaths within 1 s of start
        self.counts: dict[str, int] = {}           # root only: restarts per path
        self.owner = None
        self.escalated = False
        self.nodes: dict[str, dict] = {}           # admitted live nodes (only with placed children)
        self.placed_on: dict[str, str] = {}        # child id → node id
        self.waiting: list[str] = []               # placed children with no matching node yet
        for child in self.spec.children:
            self._start(child)
        self._subscribe_nodes()

    def receiveMsg_Init(self, msg: m.Init, sender):
        super().receiveMsg_Init(msg, sender)
        if self.supervisor is None:                # the root answers the head process
            self.owner = sender
            self.send(sender, m.Started(self.path))

    # -- starting and stopping ------------------------------------------------------------
    def _start(self, child: ChildSpec) -> None:
        cls = kinds.resolve(child.kind)
        requirements = None
        if child.placement:
            node_id = self._pick_node(child)
            if node_id is None:
                if child.id not in self.waiting:
                    self.waiting.append(child.id)
                    log.warning("%s/%s waits for a node matching %s", self.path, child.id, child.placement)
                return
            requirements = {"node_id": node_id}
            self.placed_on[child.id] = node_id
        addr = self.createActor(cls, targetActorRequirements=requirements)
        self.addresses[child.id] = addr
        self.started_at[child.id] = time.monotonic()
        self.normal_exit.discard(child.id)
        args = {**self.inherited, **child.args}
        if child.kind == "supervisor":
            args["spec"] = child.to_dict()
        self.send(addr, m.Init(child.id, f"{self.path}/{child.id}", args, self.context,
                               self.myAddress))
        if child.kind == "registry":
            self.context["registry"] = addr
            for other_id, other in self.addresses.items():
                if other_id != child.id:
                    self.send(other, m.ContextUpdate({"registry": addr}))
            if self.supervisor is None:
                self.send(addr, m.RestartCounts(dict(self.counts)))
            self._subscribe_nodes()        # a restarted registry has no subscribers

    # -- placement ----------------------------------------------------------------------
    def _subscribe_nodes(self) -> None:
        if any(c.placement for c in self.spec.children) and self.registry is not None:
            self.send(self.registry, m.Subscribe("nodes"))

    def _pick_node(self, child: ChildSpec) -> str | None:
        want = child.placement
        fits = [nid for nid, n in self.nodes.items()
                if want.get("node", n["name"]) == n["name"] and n["gpus"] >= want.get("gpus", 0)
                and n["cpus"] >= want.get("cpus", 0)]
        load = lambda nid: sum(1 for c, n in self.placed_on.items() if n == nid and c in self.addresses)  # noqa: E731
        return min(fits, key=lambda nid: (load(nid), nid), default=None)

    def receiveMsg_NodeUp(self, msg: m.NodeUp, sender):
        self.nodes[msg.node_id] = {"name": msg.name, "gpus": msg.gpus, "cpus": msg.cpus}
        waiting, self.waiting = self.waiting, []
        for child in self.spec.children:
            if child.id in waiting and not self.escalated:
                self._start(child)

    def receiveMsg_NodeLost(self, msg: m.NodeLost, sender):
        """thespian never reports children on a dead node: their node's loss is their failure."""
        self.nodes.pop(msg.node_id, None)
        for child_id, node_id in list(self.placed_on.items()):
            if node_id == msg.node_id and child_id in self.addresses and not self.escalated:
                log.warning("%s/%s: its node %s was lost (%s)", self.path, child_id, node_id, msg.reason)
                del self.placed_on[child_id]
                self._stop(child_id)          # best effort: a cut node may still run it
                self._report_restart(f"{self.path}/{child_id}")
                self._start(next(c for c in self.spec.children if c.id == child_id))

    def _stop(self, child_id: str) -> None:
        addr = self.addresses.pop(child_id, None)
        if addr is not None:    # forgetting the address makes its exit notice ignorable
            self.send(addr, ActorExitRequest())

    def on_context(self) -> None:
        for addr in self.addresses.values():
            self.send(addr, m.ContextUpdate(self.context))
        self._subscribe_nodes()

    # -- failures -----------------------------------------------------------------------
    def receiveMsg_ChildActorExited(self, msg: ChildActorExited, sender):
        child_id = next((cid for cid, a in self.addresses.items() if a == msg.childAddress), None)
        if child_id is None or self.escalated:
            return
        del self.addresses[child_id]
        child = next(c for c in self.spec.children if c.id == child_id)
        if child.restart == "temporary" or (child.restart == "transient"
                                            and child_id in self.normal_exit):
            self.gone.add(child_id)
            return
        now = time.monotonic()
        self.recent.append(now)
        while self.recent and now - self.recent[0] > self.spec.period_s:
            self.recent.popleft()
        if len(self.recent) > self.spec.max_restarts:
            self._escalate(f"{len(self.recent)} restarts within {self.spec.period_s:g} s "
                           f"(max {self.spec.max_restarts}); last failure: {child_id}")
            return
        ids = [c.id for c in self.spec.children if c.id not in self.gone]
        if self.spec.strategy == "one_for_one":
            to_restart = [child_id]
        elif self.spec.strategy == "one_for_all":
            to_restart = ids
        else:
            to_restart = ids[ids.index(child_id):]
        for other in reversed(to_restart):
            if other != child_id:
                self._stop(other)
        self._report_restart(f"{self.path}/{child_id}")
        delay = self._backoff(child_id, now)
        if delay <= 0:
            self._restart(to_restart)
        else:
            self.wakeupAfter(timedelta(seconds=delay), payload=("restart", to_restart))

    def _backoff(self, child_id: str, now: float) -> float:
        if now - self.started_at.get(child_id, 0.0) >= 1.0:
            self.quick_deaths[child_id] = 0
            return 0.0
        k = self.quick_deaths[child_id] = self.quick_deaths.get(child_id, 0) + 1
        base = self.spec.backoff_initial_s or 0.05
        return min(self.spec.backoff_max_s, base * 2 ** (k - 1))

    def _restart(self, ids: list[str]) -> None:
        for child in self.spec.children:
            if child.id in ids and child.id not in self.addresses:
                self._start(child)

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        if isinstance(msg.payload, tuple) and msg.payload[0] == "restart" and not self.escalated:
            self._restart(msg.payload[1])

    def _escalate(self, reason: str) -> None:
        log.error("%s escalates: %s", self.path, reason)
        self.escalated = True
        for child_id in [c.id for c in reversed(self.spec.children)]:
            self._stop(child_id)
        target = self.supervisor if self.supervisor is not None else self.owner
        if target is not None:
            self.send(target, m.Escalated(self.path, reason))
        if self.supervisor is not None:
            self.send(self.myAddress, ActorExitRequest())

    def receiveMsg_Escalated(self, msg: m.Escalated, sender):
        """A child supervisor gave up; its exit notice follows and is handled as a failure."""
        log.warning("%s: child %s escalated: %s", self.path, msg.path, msg.reason)
        if self.supervisor is None and self.owner is not None:
            self.send(self.owner, msg)   # the head process shows escalations as they happen

    def receiveMsg_ChildCrashed(self, msg: m.ChildCrashed, sender):
        log.warning("%s/%s crashed: %s", self.path, msg.child_id, msg.error)

    def receiveMsg_StoppingNormally(self, msg: m.StoppingNormally, sender):
        self.normal_exit.add(msg.child_id)

    def receiveMsg_ChildRestarted(self, msg: m.ChildRestarted, sender):
        self._report_restart(msg.path)

    def _report_restart(self, path: str) -> None:
        if self.supervisor is not None:
            self.send(self.supervisor, m.ChildRestarted(path))
            return
        self.counts[path] = self.counts.get(path, 0) + 1
        if self.registry is not None and "registry" in self.addresses:
            self.send(self.registry, m.RestartCounts(dict(self.counts)))

    # -- lookups ------------------------------------------------------------------------
    def receiveMsg_Lookup(self, msg: m.Lookup, sender):
        reply_to = msg.reply_to or sender
        first, _, rest = msg.path.strip("/").partition("/")
        addr = self.addresses.get(first)
        if not rest or addr is None:
            self.send(reply_to, m.LookupResult(msg.path, addr))
        else:
            self.send(addr, m.Lookup(rest, reply_to))

    def receiveMsg_StopTree(self, msg: m.StopTree, sender):
        self.escalated = True       # no restarts while shutting down
        for child_id in [c.id for c in reversed(self.spec.children)]:
            self._stop(child_id)
        self.send(sender, m.Stopped(self.path))

    def info(self) -> dict:
        return {"path": self.path, "children": sorted(self.addresses), "restarts": dict(self.counts),
                "placed_on": dict(self.placed_on), "waiting_for_a_node": list(self.waiting)}
