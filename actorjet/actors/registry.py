"""The registry actor: membership, runner placement view, restart counters, status.

Membership is decided here.  thespian tells us when a member system registers with or
drops out of the convention; that alone is too slow and too trusting, so the registry
(1) checks the join token (an HMAC of the node id in the member's capabilities),
(2) runs its own heartbeats to a NodeLink on every node and declares a node lost after
``node_timeout_s`` without an answer, and (3) re-admits a node that answers again after a
network cut under a fresh admission id, so the node stops the runners of the old one.
A node that drops out of the convention while it still answers the heartbeats is not lost:
on a saturated machine its admin can miss two 3 s re-registrations (CI once restarted a
two-host learner that way); the heartbeat, with its allowance for a starved registry, decides.
Episode bookkeeping (leases, groups, results) lives in actorjet/registry/episodes.py; the
research trials hosted on nodes (placement, states) in actorjet/registry/trials.py.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from thespian.actors import ActorSystemConventionUpdate, ChildActorExited, WakeupMessage

from actorjet.actors.trial_host import TrialHost
from actorjet.registry import trials as tr
from actorjet.registry.episodes import EpisodeDesk
from actorjet.registry.nodes import NodeTable
from actorjet.runtime import frames, load
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor, where_i_run
from actorjet.runtime.node import NodeLink

log = logging.getLogger("actorjet")


class Registry(ManagedActor):
    def on_init(self) -> None:
        ctx = self.context
        self.table = NodeTable(ctx.get("token", ""), float(ctx.get("node_timeout_s", 6.0)))
        self.heartbeat_s = float(ctx.get("heartbeat_s", 1.0))
        self.epoch = int(ctx.get("head_epoch", 1))
        self.admissions = 0
        self.runners: list = []
        self.restarts: dict = {}
        self.actors: dict[str, dict] = {}          # path → where its current incarnation runs
        self.waiting: dict[str, dict] = {}         # path → the placement no live node matches yet
        self.relinks: dict[str, int] = {}
        self.desk = EpisodeDesk(ctx, self.epoch)
        self.trials = tr.TrialBook()
        self.routes = self.desk.handlers()
        head = ctx.get("head_caps") or {}
        if head.get("node_id"):
            self.table.admit(head, "head", is_head=True)
        self.notifyOnSystemRegistrationChanges(True)
        self.wakeupAfter(timedelta(seconds=self.heartbeat_s), payload="heartbeat")
        self.next_beat = time.monotonic() + self.heartbeat_s
        self.receiveMsg_ActorUp(where_i_run(self.path), self.myAddress)

    def on_stop(self) -> None:
        if hasattr(self, "desk"):
            self.desk.close()

    # -- joining ------------------------------------------------------------------------
    def receiveMsg_ActorSystemConventionUpdate(self, msg: ActorSystemConventionUpdate, sender):
        caps = msg.remoteCapabilities or {}
        node_id = caps.get("node_id", "")
        if msg.remoteAdded:
            known = self.table.nodes.get(node_id)
            if known is not None and known.alive:
                return          # a re-registration we already know about
            self._admit(caps)
        elif node_id:
            node = self.table.nodes.get(node_id)
            if node is not None and node.alive and time.monotonic() - node.last_seen < self.table.node_timeout_s:
                log.info("node %s left the convention but answered %.1f s ago: its heartbeat decides",
                         node.name, time.monotonic() - node.last_seen)
                return
            self._lost(node_id, "left the convention (stopped or unreachable)")

    def _admit(self, caps: dict) -> None:
        reason = self.table.check(caps)
        link = self.createActor(NodeLink, targetActorRequirements={"node_id": caps.get("node_id")})
        if reason:
            log.warning("refused node %s: %s", caps.get("name"), reason)
            self.send(link, m.Introduce(False, reason))
            return
        self.admissions += 1
        node = self.table.admit(caps, f"{self.epoch}.{self.admissions}")
        node.link = link
        self.send(link, m.Introduce(True, "", node.admission, self.myAddress))
        log.info("admitted node %s (%s) with %d slots", node.name, node.node_id, node.slots)
        self._publish(m.NodeUp(node.node_id, node.name, node.slots, node.admission, node.gpus, node.cpus))

    def _lost(self, node_id: str, reason: str) -> None:
        node = self.table.mark_lost(node_id, reason)
        if node is not None:
            log.warning("node %s lost: %s", node.name, reason)
            self._publish(m.NodeLost(node_id, reason))
            self._send_all(self.desk.node_lost(node_id, self.table.lost_count))
            for t in self.trials.node_lost(node_id, reason):
                log.warning("trial %s lost with node %s", t.trial_id, node.name)

    def receiveMsg_Leaving(self, msg: m.Leaving, sender):
        self._lost(msg.node_id, "left (actorjet leave)")

    # -- heartbeats ---------------------------------------------------------------------
    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        if msg.payload == "heartbeat":
            late = time.monotonic() - self.next_beat
            if late > self.heartbeat_s:      # this registry did not run: its nodes are not late
                log.warning("registry: heartbeat %.1f s late (a starved head?); node timeouts extended by it", late)
                self.table.excuse(late)
            self.next_beat = time.monotonic() + self.heartbeat_s
            for node in self.table.to_ping(self.heartbeat_s):
                self.send(node.link, m.Ping())
            for node in self.table.overdue():
                self._lost(node.node_id, f"no heartbeat for {self.table.node_timeout_s:g} s")
            self._send_all(self.desk.tick())
            self.wakeupAfter(timedelta(seconds=self.heartbeat_s), payload="heartbeat")

    def receiveMsg_Pong(self, msg: m.Pong, sender):
        node = next((n for n in self.table.nodes.values() if n.link == sender), None)
        if node is None:
            return
        self.table.seen(node.node_id)
        node.rejected_frames = int((msg.info or {}).get("rejected_frames", node.rejected_frames))
        node.load = (msg.info or {}).get("load", node.load)
        if not node.alive and node.lost_reason.startswith("no heartbeat"):
            # Back after a network cut: a fresh admission makes it drop its old runners.
            self.admissions += 1
            node.alive, node.lost_reason = True, ""
            node.admission = f"{self.epoch}.{self.admissions}"
            self.send(node.link, m.Introduce(True, "", node.admission, self.myAddress))
            log.info("node %s is back; re-admitted", node.name)
            self._publish(m.NodeUp(node.node_id, node.name, node.slots, node.admission, node.gpus, node.cpus))

    def receiveMsg_ChildActorExited(self, msg: ChildActorExited, sender):
        """A NodeLink died.  If its node is still alive, recreate it (a few times).  A
        TrialHost died: its trials are lost (the controller places them again)."""
        host = next((n for n in self.table.nodes.values() if n.trial_host == msg.childAddress), None)
        if host is not None:
            host.trial_host = None
            for t in self.trials.node_lost(host.node_id, "its trial host exited"):
                log.warning("trial %s lost: the trial host on %s exited", t.trial_id, host.name)
            return
        node = next((n for n in self.table.nodes.values() if n.link == msg.childAddress), None)
        if node is None or not node.alive:
            return
        tries = self.relinks.get(node.node_id, 0)
        if tries >= 3:
            node.link = None
            return
        self.relinks[node.node_id] = tries + 1
        node.link = self.createActor(NodeLink, targetActorRequirements={"node_id": node.node_id})
        self.send(node.link, m.Introduce(True, "", node.admission, self.myAddress))

    # -- subscriptions and status ------------------------------------------------------
    def receiveMsg_Subscribe(self, msg: m.Subscribe, sender):
        if msg.topic == "directory":
            self._send_all(self.desk.subscribe(sender))
            return
        self.table.listen(getattr(msg, "path", ""), sender)
        for node in self.table.alive():
            self.send(sender, m.NodeUp(node.node_id, node.name, node.slots, node.admission, node.gpus, node.cpus))

    def _publish(self, msg) -> None:
        for address in self.table.listeners.values():
            self.send(address, msg)

    def receiveMsg_RunnersChanged(self, msg: m.RunnersChanged, sender):
        self.runners = self.desk.runners = msg.runners
        placed = {r["id"] for r in msg.runners if r.get("placed")}
        gone = [p for p in self.actors if p.rsplit("/", 1)[-1].startswith("runner-") and p.rsplit("/", 1)[-1] not in placed]
        for path in gone:
            del self.actors[path]           # a runner that is gone has no PID to act on

    def receiveMsg_ChildrenWaiting(self, msg: m.ChildrenWaiting, sender):
        self.waiting = {p: w for p, w in self.waiting.items() if p.rsplit("/", 1)[0] != msg.path}
        self.waiting.update({f"{msg.path}/{cid}": placement for cid, placement in msg.waiting.items()})

    def receiveMsg_ActorUp(self, msg: m.ActorUp, sender):
        self.actors[msg.path] = {"path": msg.path, "pid": msg.pid, "node": msg.node, "host": msg.host,
                                 "since": time.time()}

    def receiveMsg_RestartCounts(self, msg: m.RestartCounts, sender):
        self.restarts = dict(msg.counts)
        self.desk.restarts = self.restarts

    def receiveMsg_GetStatus(self, msg: m.GetStatus, sender):
        now = time.time()
        runners = [{"id": r["id"], "node_id": r.get("node_id"), "state": self.desk.runner_state(r, now),
                    "behaviors": dict(self.desk.upgrades.runner_versions.get(r["id"], {})),   # task → version
                    "completed": self.desk.counters.completed_by_runner.get(r["id"], 0)}
                   for r in self.runners]
        actors = [{**a, "up_s": round(now - a["since"]), "restarts": self.restarts.get(path, 0)}
                  for path, a in sorted(self.actors.items())]
        for node in self.table.nodes.values():
            if node.is_head:
                node.rejected_frames = frames.rejected_on_node()
                node.load = load.here()
        data = {"head_epoch": self.epoch,
                "nodes": [n.public() for n in self.table.nodes.values()],
                "rejected_frames": sum(n.rejected_frames for n in self.table.nodes.values()),
                "nodes_lost": self.table.lost_count,
                "runners": runners,
                "actors": actors,
                "restarts": self.restarts,
                "waiting": dict(self.waiting),      # path → the placement no live node matches
                "trials": {"capacity": self.trials.capacity(self.table.alive()),     # research trials on nodes
                           "active": [t.summary() for t in self.trials.trials.values() if t.state in tr.ACTIVE]}}
        data.update(self.desk.status())
        self.send(sender, m.Status(data))

    # -- research trials on nodes (registry/trials.py decides, this actor sends) ----------
    def receiveMsg_SubmitTrial(self, msg: tr.SubmitTrial, sender):
        node = self.trials.place(msg.trial_id, self.table.alive())
        if isinstance(node, str):
            self.send(sender, tr.TrialAnswer(409, {"error": node, **self.trials.capacity(self.table.alive())}, msg.tag))
            return
        if node.trial_host is None:
            node.trial_host = self.createActor(TrialHost, targetActorRequirements={"node_id": node.node_id})
        self.send(node.trial_host, tr.RunTrial(msg.trial_id, msg.job, msg.model_seed, msg.slots))
        log.info("trial %s placed on node %s", msg.trial_id, node.name)
        self.send(sender, tr.TrialAnswer(201, self.trials.trials[msg.trial_id].public(), msg.tag))

    def receiveMsg_TrialQuery(self, msg: tr.TrialQuery, sender):
        if not msg.trial_id:
            body = {"capacity": self.trials.capacity(self.table.alive()),
                    "trials": [t.summary() for t in self.trials.trials.values()]}
            self.send(sender, tr.TrialAnswer(200, body, msg.tag))
            return
        t = self.trials.trials.get(msg.trial_id)
        self.send(sender, tr.TrialAnswer(200, t.public(), msg.tag) if t is not None else
                  tr.TrialAnswer(404, {"error": f"no trial {msg.trial_id!r} on this swarm"}, msg.tag))

    def receiveMsg_CancelTrial(self, msg: tr.CancelTrial, sender):
        t = self.trials.cancel(msg.trial_id)
        if t is None:
            self.send(sender, tr.TrialAnswer(404, {"error": f"no trial {msg.trial_id!r} on this swarm"}, msg.tag))
            return
        node = self.table.nodes.get(t.node_id)
        if t.state == "stopping" and node is not None and node.trial_host is not None:
            self.send(node.trial_host, tr.StopTrial(t.trial_id))
        self.send(sender, tr.TrialAnswer(200, t.public(), msg.tag))

    def receiveMsg_TrialProgress(self, msg: tr.TrialProgress, sender):
        if not self.trials.progress(msg):
            self.send(sender, tr.StopTrial(msg.trial_id))     # lost meanwhile (a cut), or cancelled

    def receiveMsg_TrialEnded(self, msg: tr.TrialEnded, sender):
        t = self.trials.ended(msg)
        if t is not None:
            log.info("trial %s on %s: %s (exit %s)", t.trial_id, t.node, t.state, t.code)

    # -- episodes: the desk decides, this actor sends -----------------------------------
    def receiveUnrecognizedMessage(self, msg, sender):
        handler = self.routes.get(type(msg))
        if handler is None:
            super().receiveUnrecognizedMessage(msg, sender)
            return
        self._send_all(handler(msg, sender))

    def receiveMsg_Batch(self, msg, sender):
        """The door's messages in one frame: each handled as if it came alone, and what goes
        back to one address goes in one frame too."""
        out = []
        for inner in msg.messages if isinstance(msg.messages, list) else []:
            handler = self.routes.get(type(inner))
            if handler is not None:
                out += handler(inner, sender)
        by_address: list[tuple] = []            # (address, replies): thespian addresses do not hash
        for to, reply in out:
            entry = next((e for e in by_address if e[0] == to), None)
            if entry is None:
                by_address.append(entry := (to, []))
            entry[1].append(reply)
        for to, replies in by_address:
            self.send(to, replies[0] if len(replies) == 1 else type(msg)(replies))

    def _send_all(self, out: list) -> None:
        for to, msg in out:
            self.send(to, msg)
