"""Runner supervisor: keeps the configured number of agent runners placed on live nodes.

Runners are the only actors that live on joined nodes, so this supervisor cannot rely on
thespian alone: a runner whose *node* dies is never reported.  It subscribes to the
registry's NodeUp / NodeLost events instead.  A runner that dies on a live node is
restarted there (one_for_one, with the usual intensity); a runner whose node is lost is
re-placed on the live node with the most free slots, or waits until a node joins.

``args.runners``: how many runners to keep; 0 means one per slot on every live node.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from thespian.actors import ActorExitRequest, ChildActorExited, WakeupMessage

from actorjet.actors.runner import AgentRunner
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor

log = logging.getLogger("actorjet")


class RunnerSupervisor(ManagedActor):
    def on_init(self) -> None:
        self.wanted = int(self.args.get("runners", 0))
        self.nodes: dict[str, dict] = {}                   # node_id → {name, slots}
        self.placed: dict[str, tuple[str, object]] = {}    # runner id → (node_id, address)
        self.placed_at: dict[str, float] = {}              # runner id → when its incarnation started
        self.pending: list[str] = [f"runner-{i}" for i in range(self.wanted)]
        self.restart_times: dict[str, list[float]] = {}
        self._subscribe()

    def on_context(self) -> None:
        self._subscribe()

    def _subscribe(self) -> None:
        if self.registry is not None:
            self.send(self.registry, m.Subscribe("nodes"))

    def receiveMsg_NodeUp(self, msg: m.NodeUp, sender):
        if msg.node_id in self.nodes:
            return
        self.nodes[msg.node_id] = {"name": msg.name, "slots": msg.slots, "admission": msg.admission}
        if self.wanted == 0:   # one runner per slot
            self.pending += [f"runner-{msg.name}-{i}" for i in range(msg.slots)]
        self._place()

    def receiveMsg_NodeLost(self, msg: m.NodeLost, sender):
        self.nodes.pop(msg.node_id, None)
        for runner_id, (node_id, addr) in list(self.placed.items()):
            if node_id == msg.node_id:
                del self.placed[runner_id]
                self.send(addr, ActorExitRequest())    # best effort: the node may be gone
                if self.wanted:
                    self.pending.append(runner_id)
        self._place()

    def _free_slots(self, node_id: str) -> int:
        used = sum(1 for n, _ in self.placed.values() if n == node_id)
        return self.nodes[node_id]["slots"] - used

    def _place(self) -> None:
        while self.pending:
            candidates = [(self._free_slots(n), n) for n in self.nodes]
            candidates = [c for c in candidates if c[0] > 0]
            if not candidates:
                break
            node_id = max(candidates)[1]
            self._start(self.pending.pop(0), node_id)
        self._report()

    def _start(self, runner_id: str, node_id: str) -> None:
        addr = self.createActor(AgentRunner, targetActorRequirements={"node_id": node_id})
        self.placed[runner_id] = (node_id, addr)
        self.placed_at[runner_id] = time.time()
        args = {**self.args, "runner_id": runner_id, "node_id": node_id,
                "admission": self.nodes[node_id]["admission"]}
        context = {k: v for k, v in self.context.items() if k != "token"}   # runners never need the secret
        self.send(addr, m.Init(runner_id, f"{self.path}/{runner_id}", args, context, self.myAddress))

    def receiveMsg_ChildActorExited(self, msg: ChildActorExited, sender):
        runner_id = next((r for r, (_, a) in self.placed.items() if a == msg.childAddress), None)
        if runner_id is None:
            return
        node_id, _ = self.placed.pop(runner_id)
        if self.registry is not None:
            self.send(self.registry, m.RunnerDown(runner_id))     # its leases are re-queued now
        recent = [t for t in self.restart_times.get(runner_id, []) if time.monotonic() - t < 10]
        recent.append(time.monotonic())
        self.restart_times[runner_id] = recent
        self.send(self.supervisor, m.ChildRestarted(f"{self.path}/{runner_id}"))
        if node_id in self.nodes:
            delay = 0.0 if len(recent) <= 1 else min(5.0, 0.05 * 2 ** (len(recent) - 2))
            self.wakeupAfter(timedelta(seconds=delay), payload=("restart", runner_id, node_id))
        else:
            self.pending.append(runner_id)
            self._place()
        self._report()

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        _, runner_id, node_id = msg.payload
        if runner_id in self.placed:
            return
        if node_id in self.nodes and self._free_slots(node_id) > 0:
            self._start(runner_id, node_id)
        else:
            self.pending.append(runner_id)
            self._place()
        self._report()

    def _report(self) -> None:
        if self.registry is None:
            return
        # "placed" is all this supervisor knows; the registry adds what each runner is doing
        runners = [{"id": r, "node_id": n, "placed": True, "since": self.placed_at[r]}
                   for r, (n, _) in sorted(self.placed.items())]
        runners += [{"id": r, "node_id": None, "placed": False} for r in self.pending]
        self.send(self.registry, m.RunnersChanged(runners))

    def receiveMsg_Lookup(self, msg: m.Lookup, sender):
        placed = self.placed.get(msg.path.strip("/"))
        self.send(msg.reply_to or sender, m.LookupResult(msg.path, placed[1] if placed else None))

    def info(self) -> dict:
        return {"path": self.path, "placed": {r: n for r, (n, _) in self.placed.items()},
                "pending": list(self.pending)}
