"""The supervisor actor: starts children from a spec and keeps them alive, OTP style.

Restart types:  permanent (always restarted), transient (restarted unless it said it was
stopping normally), temporary (never restarted).
Strategies:     one_for_one (only the failed child), one_for_all (every child),
                rest_for_one (the failed child and the children started after it),
                simple_one_for_one (no children declared: they are made at run time from one
                ``child_kind``, like OTP's; ActorJet's runners are these).
Intensity:      more than ``max_restarts`` restarts within ``period_s`` → the supervisor
                stops its children, tells its parent (``Escalated``) and exits; its parent
                then treats that as a failure of its own child.  At the root, the head
                process is told and exits with a clear message.
Backoff:        runtime/backoff.py, the one policy: a child that ran for at least a second is
                restarted at once; its k-th quick death in a row waits
                ``backoff_initial_s * 2**(k-1)`` (0.05 s if unset), capped at ``backoff_max_s``.

Placement:      a child with ``placement = { node = "gpu1" }`` and/or ``{ gpus = 1, cpus = 8 }``
                starts on an admitted live node that matches (the head counts as a node; the
                one with the fewest children of this supervisor wins), or waits, without
                counting as a restart, until such a node joins.  Its own children start
                where it runs.  A model subtree placed on a GPU node serves, records and
                trains there.
Stalled children: the registry's watchdog crashes a child that is alive but stuck, and tells
its supervisor (RestartStalled); one that has not exited STALLED_GRACE_S later is hung or dead
without thespian's exit notice, and is ended (SIGKILL of its PID on this machine) and
restarted like any failed child.
Children on *other nodes* are not reported dead by thespian when their node dies; the
supervisor of a placed child subscribes to the registry's NodeUp / NodeLost events and
treats the loss of its node as the child's failure (restarted on another match, or waiting).

Dynamic children (simple_one_for_one) are placed by slots: ``count = 0`` keeps one per slot
of every live node (``KIND-NODE-i``; a lost node's children go with it), ``count = N`` keeps
N (``KIND-i``) on the nodes with the most free slots, re-placed when their node is lost.
They run agent code on joined nodes, so their context never holds the cluster token; each
gets its node's admission id (a node agent stops the children of an older admission).  The
registry is told where they are (RunnersChanged) and when one dies (RunnerDown: its leases
go back at once).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from datetime import timedelta

from thespian.actors import ActorExitRequest, ChildActorExited, WakeupMessage

from actorjet.runtime import kinds
from actorjet.runtime import messages as m
from actorjet.runtime.backoff import Backoff
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.tree_spec import ChildSpec

log = logging.getLogger("actorjet")
STALLED_GRACE_S = 5.0       # a stalled child the watchdog crashed has this long to exit by itself


def kill_own_child(pid: int) -> None:
    """SIGKILL a child process of this one (a hung actor thespian forked from here), and only
    that: a PID whose parent is not this process is someone else's."""
    import psutil

    try:
        if psutil.Process(pid).ppid() == os.getpid():
            os.kill(pid, signal.SIGKILL)
    except (psutil.Error, ProcessLookupError, PermissionError):
        pass


class Supervisor(ManagedActor):
    def on_init(self) -> None:
        self.spec = ChildSpec.from_dict(self.args["spec"])
        self.inherited = {k: v for k, v in self.args.items() if k != "spec"}
        self.addresses: dict[str, object] = {}     # child id → live address
        self.gone: set[str] = set()                # temporary children that ended, transient ones that finished
        self.normal_exit: set[str] = set()
        self.recent: deque[float] = deque()        # restart times inside the period
        self.started_at: dict[str, float] = {}
        self.incarnations: dict[str, int] = {}     # child id → how many times it was started
        self.backoff = Backoff(self.spec.backoff_initial_s or 0.05, self.spec.backoff_max_s)
        self.counts: dict[str, int] = {}           # root only: restarts per path
        self.owner = None
        self.escalated = False
        self.nodes: dict[str, dict] = {}           # admitted live nodes (only with placed children)
        self.placed_on: dict[str, str] = {}        # child id → node id
        self.waiting: list[str] = []               # placed children with no matching node yet
        self.dynamic = self.spec.strategy == "simple_one_for_one"
        if self.dynamic:                           # their specs, made at run time; count mode: all now
            self.spec.children = [ChildSpec(id=f"{self.spec.child_kind}-{i}", kind=self.spec.child_kind)
                                  for i in range(self.spec.count)]
            self.waiting = [c.id for c in self.spec.children]
            self.since: dict[str, float] = {}      # dynamic child → when its incarnation started (wall)
        else:
            for child in self.spec.children:
                self._start(child)
            self._report_waiting()
        self._subscribe_nodes()

    def receiveMsg_Init(self, msg: m.Init, sender):
        super().receiveMsg_Init(msg, sender)
        if self.supervisor is None:                # the root answers the head process
            self.owner = sender
            self.send(sender, m.Started(self.path, os.getpid()))

    # -- starting and stopping ------------------------------------------------------------
    def _start(self, child: ChildSpec) -> None:
        if self.dynamic:
            self._start_dynamic(child)
            return
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
                               self.myAddress, self._incarnation(child.id)))
        if child.registry:
            self.context["registry"] = addr
            for other_id, other in self.addresses.items():
                if other_id != child.id:
                    self.send(other, m.ContextUpdate({"registry": addr}))
            if self.supervisor is None:
                self.send(addr, m.RestartCounts(dict(self.counts)))
            self._subscribe_nodes()        # a restarted registry has no subscribers

    # -- dynamic children (simple_one_for_one) ----------------------------------------------
    def _start_dynamic(self, child: ChildSpec) -> None:
        """Start on the node it belongs to, or (count mode) on the live node with the most
        free slots; else wait."""
        node_id = self.placed_on.get(child.id)
        if node_id is None or node_id not in self.nodes or self._free_slots(node_id) <= 0:
            free = [(self._free_slots(n), n) for n in self.nodes if self._free_slots(n) > 0]
            node_id = max(free)[1] if free and self.spec.count else None
        if node_id is None or node_id not in self.nodes:
            if child.id not in self.waiting:
                self.waiting.append(child.id)
            return
        if child.id in self.waiting:
            self.waiting.remove(child.id)
        addr = self.createActor(kinds.resolve(child.kind), targetActorRequirements={"node_id": node_id})
        self.addresses[child.id], self.placed_on[child.id] = addr, node_id
        self.started_at[child.id], self.since[child.id] = time.monotonic(), time.time()
        args = {**self.inherited, **self.spec.args, "runner_id": child.id, "node_id": node_id,
                "admission": self.nodes[node_id]["admission"]}
        context = {k: v for k, v in self.context.items() if k != "token"}   # agent code never needs the secret
        self.send(addr, m.Init(child.id, f"{self.path}/{child.id}", args, context, self.myAddress,
                               self._incarnation(child.id)))

    def _incarnation(self, child_id: str) -> int:
        """Count a start of ``child_id``.  Its announcements carry the count, so the registry
        can tell a stopped incarnation's late ServiceUp from its successor's: an engine stopped
        while it loaded (its node was lost for a moment) announced after the one that replaced
        it, and every call then went to a port nothing listened on."""
        self.incarnations[child_id] = self.incarnations.get(child_id, 0) + 1
        return self.incarnations[child_id]

    def _free_slots(self, node_id: str) -> int:
        used = sum(1 for c, n in self.placed_on.items() if n == node_id and c in self.addresses)
        return self.nodes[node_id]["slots"] - used

    def _place_waiting(self) -> None:
        for child in [c for c in self.spec.children if c.id in self.waiting]:
            self._start_dynamic(child)
        self._report_children()

    def _report_waiting(self, again: bool = False) -> None:
        """Declared children that wait for a node (placement), for status (dynamic ones are
        in ``_report_children``'s rows)."""
        if self.dynamic or self.registry is None:
            return
        waiting = {c.id: dict(c.placement) for c in self.spec.children if c.id in self.waiting}
        if waiting == getattr(self, "reported_waiting", {}) and not again:
            return
        self.reported_waiting = waiting
        self.send(self.registry, m.ChildrenWaiting(self.path, waiting))

    def _report_children(self) -> None:
        """Where the dynamic children are: the registry adds what each is doing (status)."""
        if not self.dynamic or self.registry is None:
            return
        rows = [{"id": c, "node_id": self.placed_on[c], "placed": True, "since": self.since[c]}
                for c in sorted(self.addresses)]
        rows += [{"id": c, "node_id": None, "placed": False} for c in self.waiting]
        self.send(self.registry, m.RunnersChanged(rows))

    # -- placement ----------------------------------------------------------------------
    def _subscribe_nodes(self) -> None:
        if (self.dynamic or any(c.placement for c in self.spec.children)) and self.registry is not None:
            self.send(self.registry, m.Subscribe("nodes", self.path))

    def _pick_node(self, child: ChildSpec) -> str | None:
        """A live node that matches: its name, its CPUs, and GPUs its other placed children of
        this supervisor do not take already (``gpus = 1`` each: eight ranks fill an 8-GPU node,
        a ninth waits; runtime/gpus.py then gives each process its own GPU there)."""
        want = child.placement

        def running_on(nid: str) -> list[ChildSpec]:
            return [c for c in self.spec.children
                    if c.id != child.id and c.id in self.addresses and self.placed_on.get(c.id) == nid]

        def fits(nid: str, node: dict) -> bool:
            gpus_free = node["gpus"] - sum(c.placement.get("gpus", 0) for c in running_on(nid))
            return (want.get("node", node["name"]) == node["name"] and gpus_free >= want.get("gpus", 0)
                    and node["cpus"] >= want.get("cpus", 0))

        def load(nid: str) -> int:
            return sum(1 for c, n in self.placed_on.items() if n == nid and c in self.addresses)
        candidates = [nid for nid, node in self.nodes.items() if fits(nid, node)]
        return min(candidates, key=lambda nid: (load(nid), nid), default=None)

    def receiveMsg_NodeUp(self, msg: m.NodeUp, sender):
        known = msg.node_id in self.nodes
        self.nodes[msg.node_id] = {"name": msg.name, "gpus": msg.gpus, "cpus": msg.cpus, "slots": msg.slots,
                                   "admission": msg.admission}
        if self.dynamic:
            if not known and self.spec.count == 0:        # one per slot of this node
                for i in range(msg.slots):
                    cid = f"{self.spec.child_kind}-{msg.name}-{i}"
                    if not any(c.id == cid for c in self.spec.children):
                        self.spec.children.append(ChildSpec(id=cid, kind=self.spec.child_kind))
                    self.placed_on[cid] = msg.node_id
                    if cid not in self.addresses and cid not in self.waiting:
                        self.waiting.append(cid)
            if not self.escalated:
                self._place_waiting()
            return
        waiting, self.waiting = self.waiting, []
        for child in self.spec.children:
            if child.id in waiting and not self.escalated:
                self._start(child)
        self._report_waiting()

    def receiveMsg_NodeLost(self, msg: m.NodeLost, sender):
        """thespian never reports children on a dead node: their node's loss is their failure."""
        self.nodes.pop(msg.node_id, None)
        if self.dynamic:
            for child_id, node_id in list(self.placed_on.items()):
                if node_id != msg.node_id:
                    continue
                self._stop(child_id)                  # best effort: the node may be gone
                if self.spec.count:                   # count mode: placed again elsewhere
                    del self.placed_on[child_id]
                    self.waiting.append(child_id)
                else:                                 # per slot: they were that node's
                    del self.placed_on[child_id]
                    self.spec.children = [c for c in self.spec.children if c.id != child_id]
                    if child_id in self.waiting:
                        self.waiting.remove(child_id)
            if not self.escalated:
                self._place_waiting()
            return
        for child_id, node_id in list(self.placed_on.items()):
            if node_id == msg.node_id and child_id in self.addresses and not self.escalated:
                log.warning("%s/%s: its node %s was lost (%s)", self.path, child_id, node_id, msg.reason)
                del self.placed_on[child_id]
                self._stop(child_id)          # best effort: a cut node may still run it
                self._report_restart(f"{self.path}/{child_id}")
                self._start(next(c for c in self.spec.children if c.id == child_id))
        self._report_waiting()

    def _stop(self, child_id: str) -> None:
        addr = self.addresses.pop(child_id, None)
        if addr is not None:    # forgetting the address makes its exit notice ignorable
            self.send(addr, ActorExitRequest())

    def on_context(self) -> None:
        context = {k: v for k, v in self.context.items() if k != "token"} if self.dynamic else self.context
        for addr in self.addresses.values():
            self.send(addr, m.ContextUpdate(context))
        self._subscribe_nodes()
        self._report_children()          # a restarted registry knows nothing of them yet
        self._report_waiting(again=bool(getattr(self, "reported_waiting", {})))

    # -- failures -----------------------------------------------------------------------
    def receiveMsg_ChildActorExited(self, msg: ChildActorExited, sender):
        child_id = next((cid for cid, a in self.addresses.items() if a == msg.childAddress), None)
        if child_id is None or self.escalated:
            return
        del self.addresses[child_id]
        self._failed(child_id)

    def receiveMsg_RestartStalled(self, msg: m.RestartStalled, sender):
        """The watchdog crashed a stalled child; if that incarnation still holds its slot after
        STALLED_GRACE_S, it could not crash (hung) or its exit was never noticed (dead)."""
        if self.addresses.get(msg.child_id) == msg.address and not self.escalated:
            self.wakeupAfter(timedelta(seconds=STALLED_GRACE_S), payload=("stalled", msg))

    def _end_stalled(self, msg: m.RestartStalled) -> None:
        if self.addresses.get(msg.child_id) != msg.address or self.escalated:
            return                        # it crashed as asked, and was restarted: nothing to do
        log.warning("%s/%s is still there %g s after the watchdog crashed it (%s): hung, or dead "
                    "unnoticed; ending it and restarting it", self.path, msg.child_id, STALLED_GRACE_S, msg.reason)
        self._stop(msg.child_id)
        if msg.pid and msg.child_id not in self.placed_on:
            kill_own_child(msg.pid)
        self._failed(msg.child_id)

    def _failed(self, child_id: str) -> None:
        """A child is gone (its exit noticed, or ended as stalled): restart per the strategy."""
        if self.dynamic and self.registry is not None:
            self.send(self.registry, m.RunnerDown(child_id))      # its leases go back now
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
        if self.spec.strategy in ("one_for_one", "simple_one_for_one"):
            to_restart = [child_id]
        elif self.spec.strategy == "one_for_all":
            to_restart = ids
        else:
            to_restart = ids[ids.index(child_id):]
        for other in reversed(to_restart):
            if other != child_id:
                self._stop(other)
        self._report_restart(f"{self.path}/{child_id}")
        delay = self.backoff.delay(child_id, self.started_at.get(child_id, 0.0), now)
        if delay <= 0:
            self._restart(to_restart)
        else:
            self.wakeupAfter(timedelta(seconds=delay), payload=("restart", to_restart))
        self._report_children()

    def _restart(self, ids: list[str]) -> None:
        for child in self.spec.children:
            if child.id in ids and child.id not in self.addresses:
                self._start(child)
        self._report_children()

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        if isinstance(msg.payload, tuple) and msg.payload[0] == "restart" and not self.escalated:
            self._restart(msg.payload[1])
        elif isinstance(msg.payload, tuple) and msg.payload[0] == "stalled":
            self._end_stalled(msg.payload[1])

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
        """A child that finished its work (ManagedActor.stop_normally): marked, then stopped."""
        if self.addresses.get(msg.child_id) == sender:
            self.normal_exit.add(msg.child_id)
            self.send(sender, ActorExitRequest())

    def receiveMsg_ChildRestarted(self, msg: m.ChildRestarted, sender):
        self._report_restart(msg.path)

    def _report_restart(self, path: str) -> None:
        if self.supervisor is not None:
            self.send(self.supervisor, m.ChildRestarted(path))
            return
        self.counts[path] = self.counts.get(path, 0) + 1
        registry_child = next((c.id for c in self.spec.children if c.registry), None)
        if self.registry is not None and registry_child in self.addresses:
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
