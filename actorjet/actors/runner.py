"""The agent runner actor: lives on a node slot, pulls GRPO-group leases, runs behaviors.

Placed by its supervisor (simple_one_for_one, runtime/supervisor.py) with
``{"node_id": ...}`` requirements.  On start it tells the node agent which admission placed
it, so a runner left behind by a head that restarted (or by a network cut) is stopped
instead of running twice.

Episodes run in a thread pool (agent code mostly waits on HTTP), so one runner keeps
``runner_concurrency`` episodes in flight while its actor stays responsive: a short
wakeup loop collects finished groups, has a reporter thread store their rewards in every
model's episode store (runner/results.py), reports them to the registry, and asks for more
work.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import psutil
from thespian.actors import WakeupMessage

from actorjet.rl.rewards import failed
from actorjet.runner.core import Processes, RunnerCore, Threads, groups_to_take
from actorjet.runner.results import store_results
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.logs import log
from actorjet.runtime.node import NODE_AGENT_NAME, NodeAgent, on_node

POLL_S = 0.02


def _exit_later(delay_s: float) -> None:
    time.sleep(delay_s)
    os._exit(0)


class AgentRunner(ManagedActor):
    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        return on_node(capabilities, requirements)

    def on_init(self) -> None:
        self.runner_id = self.args["runner_id"]
        self.node_id = self.args["node_id"]
        agent = self.createActor(NodeAgent, globalName=NODE_AGENT_NAME)
        self.send(agent, m.RunnerHello(self.args.get("admission", ""), self.runner_id))
        train = (self.context.get("job") or {}).get("train", {})
        self.concurrency = int(train.get("runner_concurrency", 8))
        self.group_size = int(train.get("group_size", 1))
        self.isolation = train.get("isolation", "thread")           # thread | process (worker.py)
        self.core = RunnerCore(Processes(self.concurrency) if self.isolation == "process" else Threads(self.concurrency))
        self.reporter = ThreadPoolExecutor(2, thread_name_prefix="report")
        self.reporting: dict[str, Future] = {}          # lease id → its results, once stored
        self.canary_askers: dict[str, object] = {}     # canary group id → who asked for it
        self.task_memory_mb = float(train.get("task_memory_mb", 0))
        self.memory_limit_mb = float(train.get("runner_memory_mb", 0))
        self.next_memory_check = self.next_task_memory_check = 0.0
        self.waiting_for_leases = False
        self.retry_at = 0.0
        self.polling = False
        self.episodes_done = 0
        self._ask_for_work()

    def on_context(self) -> None:
        self.waiting_for_leases = False
        self._ask_for_work()

    def _free(self) -> int:
        return groups_to_take(self.concurrency, self.core.busy(), self.group_size)

    def _ask_for_work(self) -> None:
        if self.registry is None or self.waiting_for_leases or time.monotonic() < self.retry_at:
            return
        if self.isolation == "process":
            # Each task has its own worker and its own capacity here: a task whose episodes
            # stall (a crash loop, a slow environment) cannot occupy the others' room.
            per_task = max(1, self.concurrency // max(1, self.group_size))
            msg = proto.LeaseRequest(self.runner_id, per_task * 8, dict(self.core.current), per_task,
                                     self.core.busy_by_task())
        else:
            free = self._free()
            if free <= 0:
                return
            msg = proto.LeaseRequest(self.runner_id, max(1, free), dict(self.core.current))
        self.waiting_for_leases = True
        self.send(self.registry, msg)

    def _install(self, payload) -> str:
        """Load a version and make it current; the error text if it cannot be loaded."""
        error, tb = self.core.install(payload)
        if error:
            log.error("%s: behavior %s v%s %s\n%s", self.runner_id, payload.get("name") if isinstance(
                payload, dict) else "?", payload.get("version") if isinstance(payload, dict) else "?", error, tb)
        return error

    def receiveMsg_BehaviorUpdate(self, msg: proto.BehaviorUpdate, sender):
        """Swap between episodes: new leases get the new version; episodes in flight finish
        on their old one (policy finish) or are reported aborted at once (policy abort)."""
        name, version = msg.payload.get("name"), msg.payload.get("version")
        error = self._install(msg.payload)
        if not error and msg.policy == "abort":
            for lease in self.core.drop_other_versions(name, version):   # their threads finish, unread
                results = [failed(ep["episode_id"], f"upgrade abort: {name} v{version} replaced v{lease['version']}")
                           for ep in lease["episodes"]]
                self.send(self.registry, proto.GroupResult(self.runner_id, lease["lease_id"], results))
        self.send(sender, proto.BehaviorLoaded(self.runner_id, str(name), int(version or 0), error))
        self._ask_for_work()

    def receiveMsg_Canary(self, msg: proto.Canary, sender):
        """A version's trial run, through the runner core like every episode (its isolation)."""
        error, tb = self.core.start_canary(msg.payload, msg.lease)
        if error:
            self.send(sender, proto.CanaryResult(self.runner_id, msg.payload.get("name"), msg.payload.get("version"),
                                                 False, error, tb))
            return
        self.canary_askers[msg.lease["group_id"]] = sender
        self._poll_soon()

    def _finish_canaries(self) -> None:
        for group_id, payload, results in self.core.finished_canaries():
            reply_to = self.canary_askers.pop(group_id, self.registry)
            failed = next((r for r in results if r.get("error")), None)
            self.send(reply_to, proto.CanaryResult(
                self.runner_id, payload["name"], payload["version"], failed is None,
                failed["error"] if failed else "", failed.get("traceback", "") if failed else "",
                [r["reward"] for r in results]))

    def receiveMsg_Leases(self, msg: proto.Leases, sender):
        self.waiting_for_leases = False
        for payload in msg.behaviors.values():
            self._install(payload)
        for lease in msg.leases:
            refused = self.core.start(lease)
            if refused is not None:
                self.send(self.registry, proto.GroupResult(self.runner_id, lease["lease_id"], refused))
        self._poll_soon()
        self._ask_for_work()

    def receiveMsg_AbandonLease(self, msg: proto.AbandonLease, sender):
        """The registry expired this lease (idle or over its total limit): give up on it now."""
        if self.core.holds(msg.lease_id):
            self.core.abandon(msg.lease_id, str(msg.cause))
            self._poll_soon(0)

    def receiveMsg_NoWork(self, msg: proto.NoWork, sender):
        self.waiting_for_leases = False
        self.retry_at = time.monotonic() + msg.retry_s
        self._poll_soon(msg.retry_s)

    def _poll_soon(self, delay: float = POLL_S) -> None:
        if not self.polling:
            self.polling = True
            self.wakeupAfter(timedelta(seconds=delay))

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        self.polling = False
        self._finish_canaries()
        for lease, results in self.core.finished():
            for r in results:
                if r.get("error"):
                    log.warning("%s: episode %s failed: %s", self.runner_id, r["episode_id"], r["error"])
            self.reporting[lease["lease_id"]] = self.reporter.submit(store_results, lease, results)
        for lease_id, stored in list(self.reporting.items()):
            if stored.done():
                del self.reporting[lease_id]
                results = stored.result()
                self.episodes_done += len(results)
                self.send(self.registry, proto.GroupResult(self.runner_id, lease_id, results))
        self._check_health()
        self._ask_for_work()
        if self.core.busy() or self.canary_askers or self.reporting or not self.waiting_for_leases:
            self._poll_soon()

    def _check_health(self) -> None:
        """Hung episodes hold threads; leaked memory stays in this process.  Past a limit the
        runner reports its work as failed (so it is retried elsewhere) and crashes on purpose:
        its supervisor starts a clean process, and no other runner is touched."""
        hung = self.core.relieve_hung(max(1, self.concurrency // 2))
        if self.task_memory_mb and time.monotonic() > self.next_task_memory_check:
            self.next_task_memory_check = time.monotonic() + 1.0     # psutil is not free: once a second
            for name, rss in self.core.restart_workers_over(self.task_memory_mb):
                log.warning("%s: task %s's worker uses %.0f MB: restarted", self.runner_id, name, rss)
        reason = ""
        if len(hung) >= max(1, self.concurrency // 2):
            reason = f"{len(hung)} hung episodes hold its threads"
        elif self.memory_limit_mb and time.monotonic() > self.next_memory_check:
            self.next_memory_check = time.monotonic() + 1.0
            rss_mb = psutil.Process().memory_info().rss / 2**20
            if rss_mb > self.memory_limit_mb:
                reason = f"it uses {rss_mb:.0f} MB, over runner_memory_mb = {self.memory_limit_mb:g}"
        if not reason:
            return
        for lease in self.core.give_up_all():
            results = [failed(ep["episode_id"], f"runner restarted: {reason}") for ep in lease["episodes"]]
            self.send(self.registry, proto.GroupResult(self.runner_id, lease["lease_id"], results))
        raise RuntimeError(f"runner {self.runner_id} restarts because {reason}")

    def on_stop(self) -> None:
        if getattr(self, "reporter", None):
            self.reporter.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "core", None):
            self.core.close()
            # Interpreter exit joins the pool's threads; a hung behavior would keep this process
            # alive for ever.  If it has not exited 2 s from now, it leaves without them.
            threading.Thread(target=_exit_later, args=(2.0,), daemon=True).start()

    def info(self) -> dict:
        return {"path": self.path, "runner_id": getattr(self, "runner_id", None),
                "node_id": getattr(self, "node_id", None), "episodes_done": getattr(self, "episodes_done", 0)}
