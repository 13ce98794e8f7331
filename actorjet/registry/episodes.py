"""Episode bookkeeping inside the registry: the service directory, task sources, behaviors,
GRPO-group leases and their results.

Leases are handed out a whole GRPO group at a time (one message for ``group_size``
episodes, which keeps thespian far below its message budget) and only while the pipeline
holds fewer than ``groups_per_step * (max_staleness + 1)`` untrained groups: that window
is what bounds how stale a sample can be when the learner sees it.
"""
from __future__ import annotations

import importlib
import time

import cloudpickle

from actorjet.models import keys
from actorjet.registry import behaviors
from actorjet.registry.behavior_store import BehaviorStore
from actorjet.registry.upgrades import UpgradeDesk
from actorjet.runtime import messages as m
from actorjet.runtime.logs import log


def load_function(ref: str):
    module_name, _, name = ref.partition(":")
    module = importlib.import_module(module_name)
    return module, getattr(module, name)


class TaskSource:
    """A task stream and its behavior.  The behavior is named after the task, and its live
    version comes from the store: after a restart the upgraded code keeps running, unless
    the job config now names a different function (then that becomes a new version)."""

    def __init__(self, cfg: dict, seed: int, secret: str, store: BehaviorStore):
        self.name, self.cfg, self.secret = cfg["name"], cfg, secret
        self.behavior = self.name
        self.tasks = importlib.import_module(cfg["source"]).tasks(seed)
        current = store.current(self.name)
        if current is None or store.index(self.name).get("config") != cfg["behavior"]:
            module, fn = load_function(cfg["behavior"])
            cloudpickle.register_pickle_by_value(module)   # nodes need not have the file
            current = store.add(self.name, cloudpickle.dumps(fn), cfg["behavior"])
            store.set_config(self.name, cfg["behavior"])
            store.activate(self.name, current)
        self.set_version(current, store.blob(self.name, current))

    def set_version(self, version: int, blob: bytes) -> None:
        self.version = version
        self.payload = behaviors.sign(self.secret, self.name, version, blob)


class EpisodeDesk:
    def __init__(self, registry, context: dict):
        self.registry = registry
        self.job = context.get("job") or {}
        self.token = context.get("token", "")
        train = self.job.get("train", {})
        self.group_size = train.get("group_size", 8)
        self.window = train.get("groups_per_step", 32) * (train.get("max_staleness", 1) + 1)
        self.lease_timeout = train.get("lease_timeout_s", 120.0)
        self.store = BehaviorStore(context.get("run_dir"))
        self.sources = [TaskSource(t, train.get("seed", 0), self.token, self.store)
                        for t in self.job.get("tasks", [])]
        self.upgrades = UpgradeDesk(self)
        self.runner_addr: dict[str, object] = {}     # runner id → address (from its lease requests)
        self.services: dict[str, dict] = {}
        self.subscribers: list = []
        self.leases: dict[str, dict] = {}            # group id → lease (+ runner id)
        self.client_groups: dict[str, list] = {}     # client-mode group → ended episodes
        self.client_open: dict[str, dict] = {}
        self.models: dict[str, dict] = {}            # name → {weight_version, learner_step, consumed}
        self.runner_versions: dict[str, dict] = {}
        self.issued = self.dropped = self.groups = 0
        self.finished = False
        self.counts = {"completed": 0, "aborted": 0, "in_flight": 0, "trained": 0}
        self.abort_causes: dict[str, int] = {}

    # -- dispatch -----------------------------------------------------------------------
    def handle(self, msg, sender) -> bool:
        handler = getattr(self, f"on_{type(msg).__name__}", None) or \
            getattr(self.upgrades, f"on_{type(msg).__name__}", None)
        if handler is None:
            return False
        handler(msg, sender)
        return True

    # -- directory ----------------------------------------------------------------------
    def on_ServiceUp(self, msg: m.ServiceUp, sender):
        self.services.setdefault(msg.model, {})[msg.kind] = {"url": msg.url, "address": msg.address}
        if msg.kind == "learner":
            self.models.setdefault(msg.model, {"weight_version": 0, "learner_step": 0, "consumed": 0})
        self._publish()

    def subscribe(self, sender) -> None:
        if sender not in self.subscribers:
            self.subscribers.append(sender)
        self.registry.send(sender, m.Directory(self.services))

    def _publish(self) -> None:
        for sub in self.subscribers:
            self.registry.send(sub, m.Directory(self.services))

    def gateway_urls(self) -> dict[str, str]:
        return {name: s["gateway"]["url"] for name, s in self.services.items() if "gateway" in s}

    def source(self, name) -> TaskSource | None:
        return next((s for s in self.sources if s.name == name), None)

    def live_runners(self, with_address: bool = True) -> list[str]:
        """Placed runners (as the runner supervisor last reported), optionally only those
        whose address we know from a lease request."""
        placed = [r["id"] for r in self.registry.runners if r.get("state") == "placed"]
        return [r for r in placed if r in self.runner_addr] if with_address else placed

    # -- leases -------------------------------------------------------------------------
    def _room(self) -> int:
        consumed = min((v["consumed"] for v in self.models.values()), default=0)
        return self.window - (self.issued - consumed - self.dropped)

    def on_LeaseRequest(self, msg: m.LeaseRequest, sender):
        urls = self.gateway_urls()
        self.runner_addr[msg.runner_id] = sender
        self.runner_versions[msg.runner_id] = dict(msg.behaviors)
        if self.finished:
            self.registry.send(sender, m.NoWork(2.0, "training finished"))
            return
        if not self.sources or not urls or not self.models:
            self.registry.send(sender, m.NoWork(0.2, "models not ready"))
            return
        n = min(msg.max_groups, self._room())
        if n <= 0:
            self.registry.send(sender, m.NoWork(0.05, "waiting for the learner (staleness bound)"))
            return
        leases, behaviors = [], {}
        for _ in range(n):
            source = self.sources[self.groups % len(self.sources)]
            self.groups += 1
            self.issued += 1
            group_id = f"g{self.registry.epoch}_{self.groups}"
            task = next(source.tasks)
            episodes = [{"episode_id": f"{group_id}.{k}", "api_key": keys.mint(self.token, f"{group_id}.{k}")}
                        for k in range(self.group_size)]
            lease = {"group_id": group_id, "task_name": source.name, "task": task, "urls": urls,
                     "behavior": source.behavior, "version": source.version, "episodes": episodes,
                     "deadline": time.time() + self.lease_timeout}
            self.leases[group_id] = dict(lease, runner_id=msg.runner_id)
            leases.append(lease)
            if msg.behaviors.get(source.behavior) != source.version:
                behaviors[source.behavior] = source.payload
        self.counts["in_flight"] += n * self.group_size
        self.registry.send(sender, m.Leases(leases, behaviors))

    def on_GroupResult(self, msg: m.GroupResult, sender):
        lease = self.leases.pop(msg.group_id, None)
        if lease is None:
            log.warning("late result for group %s (lease expired or unknown): ignored", msg.group_id)
            return
        self.counts["in_flight"] -= len(lease["episodes"])
        failed = [r for r in msg.results if r.get("error") or r.get("reward") is None]
        if failed:
            error = failed[0].get("error", "no reward")
            cause = error if error.startswith("upgrade abort") else f"behavior error: {error}"
            self._drop(lease, cause[:120], len(lease["episodes"]))
            return
        self.counts["completed"] += len(msg.results)
        rewards = {r["episode_id"]: r["reward"] for r in msg.results}
        group = {k: lease[k] for k in ("group_id", "task_name", "behavior", "version")}
        group["episodes"] = [{"episode_id": e["episode_id"], "reward": rewards[e["episode_id"]]}
                             for e in lease["episodes"]]
        self._to_merger(group)

    def _drop(self, lease: dict, cause: str, n: int) -> None:
        self.counts["aborted"] += n
        self.dropped += 1
        self.abort_causes[cause.split(":")[0]] = self.abort_causes.get(cause.split(":")[0], 0) + n
        log.warning("group %s dropped whole: %s", lease["group_id"], cause)

    def _to_merger(self, group: dict) -> None:
        merger = self.services.get("", {}).get("merger")
        if merger is None:
            log.error("no merger registered; group %s dropped", group["group_id"])
            self.dropped += 1
            return
        self.registry.send(merger["address"], m.GroupDone(group))

    def node_lost(self, node_id: str) -> None:
        runners = {r["id"] for r in self.registry.runners if r.get("node_id") == node_id}
        for group_id, lease in list(self.leases.items()):
            if lease["runner_id"] in runners:
                del self.leases[group_id]
                self.counts["in_flight"] -= len(lease["episodes"])
                self._drop(lease, "node lost", len(lease["episodes"]))

    def tick(self) -> None:
        self.upgrades.tick()
        now = time.time()
        for group_id, lease in list(self.leases.items()):
            if lease["deadline"] < now:
                del self.leases[group_id]
                self.counts["in_flight"] -= len(lease["episodes"])
                self._drop(lease, "lease expired", len(lease["episodes"]))

    # -- learners -----------------------------------------------------------------------
    def on_Trained(self, msg: m.Trained, sender):
        info = self.models.setdefault(msg.model, {"weight_version": 0, "learner_step": 0, "consumed": 0})
        info.update(weight_version=msg.weight_version, learner_step=msg.step)
        info["consumed"] += msg.groups
        self.counts["trained"] += msg.groups * self.group_size
        if msg.done:
            self.finished = True

    # -- client mode ----------------------------------------------------------------------
    def on_ClientEvent(self, msg: m.ClientEvent, sender):
        ev = msg.event
        if ev["event"] == "open":
            self.client_open[ev["episode_id"]] = ev
            self.counts["in_flight"] += 1
            return
        opened = self.client_open.pop(ev["episode_id"], None)
        if opened is None:
            return
        self.counts["in_flight"] -= 1
        if ev["event"] == "abort":
            self.counts["aborted"] += 1
            self.abort_causes["client abort"] = self.abort_causes.get("client abort", 0) + 1
            return
        self.counts["completed"] += 1
        self.issued += 1
        group_key = opened.get("group") or ev["episode_id"]
        size = int(opened.get("group_size") or 1)
        members = self.client_groups.setdefault(group_key, [])
        members.append({"episode_id": ev["episode_id"], "reward": ev["reward"]})
        if len(members) >= size:
            del self.client_groups[group_key]
            self._to_merger({"group_id": f"c_{group_key}", "task_name": "client", "behavior": "client",
                             "version": 0, "episodes": members})

    # -- status ---------------------------------------------------------------------------
    def status(self) -> dict:
        return {"episodes": dict(self.counts), "aborted_by_cause": dict(self.abort_causes),
                "models": [{"name": k, "weight_version": v["weight_version"], "learner_step": v["learner_step"]}
                           for k, v in sorted(self.models.items())],
                "behaviors": self.upgrades.status(), "upgrades": self.upgrades.push_report(),
                "training_finished": self.finished,
                "services": {k: {kind: s["url"] for kind, s in v.items()} for k, v in self.services.items()}}

    def close(self) -> None:
        pass
