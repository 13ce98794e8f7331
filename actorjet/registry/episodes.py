"""The registry's desks, composed: the service directory, the task sources and their
behaviors (a cocktail changed live), the runners and what they are doing, liveness, and
status.  Each other responsibility is a desk of its own, with the messages it owns: leases
(issue, retry, re-queue, expire; client-mode episodes too) in leases.py, what the learners and
the episode stores report (and the run's history files) in learners.py, upgrades and
rollbacks in upgrades.py.  Whether a group is complete is the stores' judgment
(store/completed.py).

A plain state object, like the desks it holds: ``handlers()`` maps each message type to a
method that takes the message and its sender and returns the messages to send, as
(address, message) pairs; the registry actor sends them.  No actor, no back-pointer: what
it must know of the registry (placed runners, restart counts) is handed to it.
"""
from __future__ import annotations

import time

from actorjet.registry.behavior_store import BehaviorStore
from actorjet.registry.counters import Counters
from actorjet.registry.learners import LearnerDesk, keep_latest
from actorjet.registry.leases import LeaseDesk, Out
from actorjet.registry.task_source import TaskSource
from actorjet.registry.upgrades import UpgradeDesk
from actorjet.registry.watchdog import Watchdog
from actorjet import disk
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.logs import log

QUIET_RUNNER_S = 10.0     # a placed runner that asked for no work this long is named in status


class EpisodeDesk:
    def __init__(self, context: dict, epoch: int = 1):
        self.job = context.get("job") or {}
        self.token = context.get("token", "")
        self.run_dir = context.get("run_dir")
        train = self.job.get("train", {})
        self.store = BehaviorStore(context.get("run_dir"))
        self.sources = [TaskSource(t, train.get("seed", 0), self.token, self.store)
                        for t in self.job.get("tasks", [])]
        self.removed: dict[str, TaskSource] = {}
        self.counters = Counters()
        self.leases = LeaseDesk(train, self.token, epoch, self.counters)
        self.upgrades = UpgradeDesk(self.token, self.store, self.sources)
        self.runners: list[dict] = []                # the runners' supervisor's last report
        self.restarts: dict[str, int] = {}           # restarts per child path (for the metrics' swarm lines)
        self.nodes_lost = 0
        self.runner_addr: dict[str, object] = {}     # runner id → address (from its lease requests)
        self.runner_asked: dict[str, tuple[float, str]] = {}     # runner id → (last request, why no work)
        self.services: dict[str, dict] = {}
        self.supervised: dict[tuple, tuple] = {}   # (model, kind) → (its supervisor, child id, pid)
        self.incarnations: dict[tuple, int] = {}   # (model, kind) → the announcing incarnation
        self.replicas: dict[str, dict] = {}      # model → its gateway's view of its engine replicas
        self.hardware: dict[str, dict] = {}      # model → kind (engine, engine.1, learner) → device, memory
        train = (context.get("job") or {}).get("train", {})
        self.watchdog = Watchdog(float(train.get("stall_s", 120.0)))
        self.full_disks = disk.FullDisks()            # who cannot write for want of space (DiskFull)
        self.batch_groups = int(train.get("groups_per_step", 1))
        self.subscribers: list = []
        self.learners = LearnerDesk(self.run_dir, train, self.full_disks,       # progress, stores' news, history
                                    lambda: {**self.status_counts(), "restarts": dict(self.restarts),
                                             "nodes_lost": self.nodes_lost})

    # -- dispatch -----------------------------------------------------------------------
    def handlers(self) -> dict:
        """Message type → handler(msg, sender) → [(address, message)]."""
        u = self.upgrades
        return {
            **self.learners.handlers(),        # Metric, Trained, Evaluated, StoreNews, StoreCounts, Resumed
            m.ServiceUp: self.on_ServiceUp, proto.TaskCommand: self.on_TaskCommand,
            proto.LeaseRequest: self.on_LeaseRequest, proto.GroupResult: self.on_GroupResult,
            m.RunnerDown: self.on_RunnerDown, proto.Progress: self.on_Progress,
            proto.EngineReplicas: lambda msg, sender: keep_latest(self.replicas, msg.model, msg.replicas),
            proto.Hardware: lambda msg, sender: keep_latest(self.hardware.setdefault(str(msg.model), {}),
                                                             msg.kind, msg.info),
            proto.DiskFull: lambda msg, sender: self.full_disks.report(str(msg.who), str(msg.cause)) or [],
            proto.Quarantined: lambda msg, sender: self.counters.quarantine(msg.cause) or [],
            proto.ClientEvent: lambda msg, sender: self.route(self.leases.client_event(msg.event)),   # client mode
            proto.EpisodeActivity: self.on_EpisodeActivity,
            proto.Upgrade: lambda msg, sender: u.upgrade(msg, sender, self.live_runner_addresses(), self.gateway_urls()),
            proto.CanaryResult: lambda msg, sender: u.canary_result(msg, self.live_runner_addresses()),
            proto.Rollback: lambda msg, sender: u.rollback(msg, sender, self.live_runner_addresses()),
            proto.BehaviorLoaded: lambda msg, sender: u.behavior_loaded(msg),
        }

    def route(self, out: Out) -> Out:
        """Address the roles the lease desk speaks to: ``gateways`` (each of them) and
        ``("runner", id)``."""
        routed: Out = []
        for to, msg in out:
            if to == "gateways":
                routed += [(s["gateway"]["address"], msg) for s in self.services.values()
                           if s.get("gateway", {}).get("address") is not None]
            elif isinstance(to, tuple) and to[0] == "runner":      # a runner by id (known from its requests)
                if to[1] in self.runner_addr:
                    routed.append((self.runner_addr[to[1]], msg))
            else:
                routed.append((to, msg))
        return routed

    # -- directory ----------------------------------------------------------------------
    def on_ServiceUp(self, msg: m.ServiceUp, sender) -> Out:
        known = self.supervised.get((msg.model, msg.kind))
        if (known is not None and known[:2] == (msg.supervisor, msg.child_id)
                and msg.incarnation < self.incarnations.get((msg.model, msg.kind), 0)):
            # A stopped incarnation's late announcement (it was stopped while it started, and
            # its successor announced first): the directory keeps the successor's address.
            log.info("%s %s: the announcement of a stopped incarnation (%d) is ignored",
                     msg.model, msg.kind, msg.incarnation)
            return []
        self.incarnations[(msg.model, msg.kind)] = msg.incarnation
        before = self.services.get(msg.model, {}).get(msg.kind, {}).get("address")
        self.services.setdefault(msg.model, {})[msg.kind] = {"url": msg.url, "address": msg.address}
        if before is not None and before != msg.address:
            self._forget_subscriber(before)
        self.supervised[(msg.model, msg.kind)] = (msg.supervisor, msg.child_id, msg.pid)
        if msg.kind == "learner":
            self.learners.learner_up(msg.model)
        return self._publish()

    def subscribe(self, sender) -> Out:
        if sender not in self.subscribers:
            self.subscribers.append(sender)
        return [(sender, m.Directory(self.services, self.task_table()))]

    def _forget_subscriber(self, address) -> None:
        """A restarted actor's old incarnation gets no more directories.  Sends to a dead
        address are not free: on a lost node each one is a TCP connect left pending for
        minutes, and thespian holds all of the registry's sends once 20 are pending."""
        serving = any(s.get("address") == address for kinds in self.services.values() for s in kinds.values())
        if not serving and address in self.subscribers:
            self.subscribers.remove(address)

    def _publish(self) -> Out:
        return [(sub, m.Directory(self.services, self.task_table())) for sub in self.subscribers]

    def task_table(self) -> dict:
        return {s.name: {"weight": s.weight, "state": s.state, "issued": s.issued} for s in self.sources}

    # -- cocktail: tasks added, paused, resumed, removed while training runs ---------------
    def on_TaskCommand(self, msg: proto.TaskCommand, sender) -> Out:
        source = self.source(msg.name)
        error = ""
        if msg.action == "add":
            if source is not None:
                error = f"task {msg.name!r} exists already"
            else:
                from actorjet.config import task_section
                from actorjet.errors import UserError
                try:
                    cfg = task_section({**msg.config, "name": msg.name}, f"task {msg.name}")
                    seed = self.job.get("train", {}).get("seed", 0)
                    self.sources.append(TaskSource(cfg, seed, self.token, self.store))
                except (UserError, ImportError, AttributeError, ValueError) as e:
                    error = f"cannot add task {msg.name!r}: {e}"
        elif source is None:
            error = f"no task named {msg.name!r} (tasks: {', '.join(s.name for s in self.sources) or 'none'})"
        elif msg.action in ("pause", "resume"):
            source.state = "paused" if msg.action == "pause" else "active"
        elif msg.action == "remove":
            self.sources.remove(source)       # its groups in flight still finish and train
            self.removed[source.name] = source
        else:
            error = f"unknown action {msg.action!r}"
        out = [] if error else self._publish()
        return out + [(sender, proto.TaskReply(not error, error, self.task_table()))]

    def gateway_urls(self) -> dict[str, str]:
        return {name: s["gateway"]["url"] for name, s in self.services.items() if "gateway" in s}

    def serving(self, urls: dict[str, str]) -> bool:
        """Every gateway has an engine behind it (its model's, or its base's): leases handed out
        before that would fail their episodes with 503s (a slow engine start dropped groups)."""
        base = {mc["name"]: mc.get("base") or mc["name"] for mc in self.job.get("models", [])}
        return all("engine" in self.services.get(base.get(name, name), {}) for name in urls)

    def source(self, name) -> TaskSource | None:
        return next((s for s in self.sources if s.name == name), None)

    def placed_runners(self) -> list[str]:
        """Placed runners, as their supervisor last reported."""
        return [r["id"] for r in self.runners if r.get("placed")]

    def live_runner_addresses(self) -> dict[str, object]:
        """Placed runners whose address we know from a lease request: id → address."""
        return {r: self.runner_addr[r] for r in self.placed_runners() if r in self.runner_addr}

    # -- leases (leases.py) -----------------------------------------------------------------
    def on_LeaseRequest(self, msg: proto.LeaseRequest, sender) -> Out:
        urls = self.gateway_urls()
        self.runner_addr[msg.runner_id] = sender
        self.upgrades.runner_versions[msg.runner_id] = dict(msg.behaviors)
        if self.learners.finished:
            return self._no_work(msg, sender, 2.0, "training finished")
        if self.full_disks.paused:
            return self._no_work(msg, sender, disk.RETRY_S, "paused: disk full")
        if not self.sources or not urls or not self.learners.models or not self.serving(urls):
            return self._no_work(msg, sender, 0.2, "models not ready")
        leases = self.leases.lease(self.sources, msg.runner_id, msg.max_groups,
                                   self.learners.consumed([s.name for s in self.sources]), urls,
                                   msg.per_task, dict(msg.busy))
        if not leases:
            return self._no_work(msg, sender, 0.05, "waiting for the learner (staleness bound)")
        self.runner_asked[msg.runner_id] = (time.time(), "")
        payloads = {}
        for lease in leases:
            if msg.behaviors.get(lease["behavior"]) != lease["version"]:
                source = self.source(lease["behavior"]) or self.removed[lease["behavior"]]   # removed: retries finish
                payloads[lease["behavior"]] = source.payload_for(lease["version"], self.store)
        return [(sender, proto.Leases(leases, payloads, msg.tag))]

    def _no_work(self, msg: proto.LeaseRequest, sender, retry_s: float, reason: str) -> Out:
        self.runner_asked[msg.runner_id] = (time.time(), reason)
        return [(sender, proto.NoWork(retry_s, reason, msg.tag))]

    def runner_state(self, row: dict, now: float) -> str:
        """What a runner is doing, from what the registry sees of it: its leases, and how its
        last request for work was answered."""
        if not row.get("placed"):
            return "waiting for a node"
        episodes = sum(len(lease["members"]) for lease in self.leases.leases.values()
                       if lease["runner_id"] == row["id"])
        if episodes:
            return f"running {episodes} episode" + ("s" if episodes > 1 else "")
        asked, reason = self.runner_asked.get(row["id"], (0.0, ""))
        if asked < row.get("since", 0.0):
            return "starting"
        if now - asked > QUIET_RUNNER_S:
            return f"not asking for work ({now - asked:.0f} s)"
        return f"idle: {reason}" if reason else "idle"

    def on_GroupResult(self, msg: proto.GroupResult, sender) -> Out:
        return self.route(self.leases.on_result(msg))

    def on_RunnerDown(self, msg: m.RunnerDown, sender) -> Out:
        return self.route(self.leases.lost({msg.runner_id}, "runner died"))

    def node_lost(self, node_id: str, lost_so_far: int) -> Out:
        self.nodes_lost = lost_so_far
        runners = {r["id"] for r in self.runners if r.get("node_id") == node_id}
        return self.route(self.leases.lost(runners, "node lost"))

    def tick(self) -> Out:
        self.learners.retry_writes()
        return self.upgrades.tick() + self.route(self.leases.tick()) + self._watch()

    # -- liveness (watchdog.py) --------------------------------------------------------------
    def on_Progress(self, msg: proto.Progress, sender) -> Out:
        self.watchdog.progress(f"{msg.model}/{msg.kind}", msg.count, msg.waiting, sender, time.time())
        return []

    def _watch(self) -> Out:
        """Learners report progress through Trained; their work is the complete groups their
        store holds untrained (StoreNews).  Anything stalled is crashed on purpose: its
        supervisor restarts it."""
        now = time.time()
        size = self.batch_groups
        for model, info in self.learners.models.items():
            learner = self.services.get(model, {}).get("learner")
            if learner is None or self.learners.finished or info.get("evaluating_step") is not None:
                self.watchdog.forget(f"{model}/learner")
                continue
            backlog = self.learners.untrained.get(model, 0)
            owes_a_step = backlog >= size and not self.full_disks.paused     # (a full disk pauses it: not a stall)
            self.watchdog.progress(f"{model}/learner", info["learner_step"], int(owes_a_step), learner["address"], now)
        out: Out = []
        for who, address, reason in self.watchdog.check(now):
            log.error("watchdog: %s %s; restarting it", who, reason)
            out.append((address, m.Crash(f"watchdog: {reason}")))
            model, _, kind = who.rpartition("/")
            supervisor, child_id, pid = self.supervised.get((model, kind), (None, "", 0))
            if supervisor is not None and self.services.get(model, {}).get(kind, {}).get("address") == address:
                out.append((supervisor, m.RestartStalled(child_id, address, pid, reason)))
        return out

    def watchdog_line(self) -> str:
        """One line for operators: what the swarm is doing, or what is wrong with it."""
        stalled = self.watchdog.status(time.time())["stalled"]
        if stalled:
            return "stalled: " + ", ".join(f"{who}, {s} s" for who, s in stalled.items())
        if self.learners.finished:
            steps = [info["learner_step"] for info in self.learners.models.values()]
            return f"training finished at step {max(steps, default=0)}"
        if not self.placed_runners() and not self.runner_addr:
            return "waiting for runners (join a node, or start the head with --slots)"
        return "training"

    def on_EpisodeActivity(self, msg: proto.EpisodeActivity, sender) -> Out:
        """Episodes that called a model lately: their leases (and client episodes) stay alive."""
        now, ids = time.time(), [e for e in msg.episode_ids if isinstance(e, str)]
        self.leases.touch(ids, now)
        return []

    # -- status ---------------------------------------------------------------------------
    def status_counts(self) -> dict:
        c = self.counters
        episodes = c.episodes()
        episodes["trained"] = self.learners.episodes_trained()
        tasks = {name: {**t, "completed": c.completed_by_task.get(name, 0),
                        "aborted_by_cause": dict(c.abort_by_task.get(name, {}))}
                 for name, t in self.task_table().items()}
        groups = {
            "finished": self.learners.finished_groups(),     # the stores' word: complete in a store
            "dropped": c.groups_dropped,
            "quarantined": c.groups_quarantined,
            "quarantined_by_cause": dict(c.quarantine_causes),
            "dropped_by_cause": dict(c.drop_causes),
            "late_results_rejected": c.late_results,
            **self.leases.status(),
        }
        return {"episodes": episodes, "aborted_by_cause": dict(c.abort_causes), "tasks": tasks, "groups": groups}

    def model_status(self, name: str, progress: dict) -> dict:
        """One model's row of status: its learner's progress, scores, replicas and hardware."""
        recent = list(self.learners.recent.get(name, []))
        return {"name": name, "weight_version": progress["weight_version"], "learner_step": progress["learner_step"],
                "accuracy": dict(self.learners.accuracy.get(name, {})), "recent": recent,
                "engine_replicas": self.replicas.get(name, {}), "hardware": self.hardware.get(name, {}),
                "learner_ranks": next((r["rank_step_s"] for r in reversed(recent) if r.get("rank_step_s")), [])}

    def status(self) -> dict:
        learners = self.learners
        return {
            **self.status_counts(),
            "models": [self.model_status(k, v) for k, v in sorted(learners.models.items())],
            "behaviors": self.upgrades.status(self.placed_runners()),
            "upgrades": self.upgrades.push_report(),
            "training_finished": learners.finished,
            "watchdog": self.watchdog_line(),
            "recovered": learners.recovered,
            "disk_full": dict(self.full_disks.reports),
            "paused": self.full_disks.line(),
            **self.watchdog.status(time.time()),
            "services": {k: {kind: s["url"] for kind, s in v.items()} for k, v in self.services.items()},
        }

    def close(self) -> None:
        self.learners.close()
