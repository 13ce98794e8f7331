"""What every agent runner does with its leases, whoever hands them out: the thespian runner
actor (actors/runner.py) and the outbound runner that polls the head's door over HTTP
(runner/outbound.py) differ only in how work and results travel.

The core keeps the behavior versions it was given (a lease runs on exactly the version it
names), starts a lease's episodes under an isolation strategy, and gives each lease back
with its results once every episode finished or the lease ran out of time.  An episode
still running then is reported failed, and its thread (or worker) is left to the runner's
health check: agent code cannot be stopped from outside, only abandoned.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from actorjet.rl.rewards import failed
from actorjet.runner.episode import load_behavior, run_episode
from actorjet.runner.worker import TaskWorker

KEEP_VERSIONS = 8      # per behavior: leases in flight may still need older ones


def groups_to_take(capacity: int, busy: int, group_size: int) -> int:
    """Whole groups a runner asks for: what fits its free episode slots, and one when it is
    idle even if a group is larger than its capacity (the episodes past it wait for a thread).
    A job with runner_concurrency < group_size used to leave every runner idle for good,
    shown as "starting" in status."""
    return max(1 if busy == 0 else 0, (capacity - busy) // max(1, group_size))


class Threads:
    """isolation = "thread": every task's episodes share one thread pool (agent code mostly
    waits on HTTP)."""

    def __init__(self, size: int):
        self.pool = ThreadPoolExecutor(size, thread_name_prefix="episode")

    def submit(self, lease: dict, fn, payload: dict) -> list[Future]:
        return [self.pool.submit(run_episode, fn, lease["task"], lease["urls"], ep) for ep in lease["episodes"]]

    def relieve(self, hung: list[tuple[str, Future]], limit: int) -> list[tuple[str, Future]]:
        """The hung episodes that hold the runner's own threads: all of them (nothing frees a
        thread that agent code holds; the runner restarts past its limit)."""
        return hung

    def restart_over(self, memory_mb: float) -> list[tuple[str, float]]:
        """Episodes share the runner's process: its own memory limit applies, nothing here."""
        return []

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Processes:
    """isolation = "process": each task's episodes in that task's own worker process
    (runner/worker.py), so a task that crashes or leaks cannot hurt the others."""

    def __init__(self, threads_per_task: int):
        self.threads = threads_per_task
        self.workers: dict[str, TaskWorker] = {}

    def submit(self, lease: dict, fn, payload: dict) -> list[Future]:
        task = lease["task_name"]
        if task not in self.workers:
            self.workers[task] = TaskWorker(task, self.threads)
        return [self.workers[task].submit(payload, lease["task"], lease["urls"], ep) for ep in lease["episodes"]]

    def relieve(self, hung: list[tuple[str, Future]], limit: int) -> list[tuple[str, Future]]:
        """Hung episodes hold only their task's worker: a task with ``limit`` of them gets a
        new worker (its futures fail, so they stop counting as hung); none holds the runner's."""
        for task in {t for t, _ in hung}:
            held = sum(1 for t, _ in hung if t == task)
            if held >= limit and task in self.workers:
                self.workers[task].kill(f"{held} hung episodes")
        return []

    def restart_over(self, memory_mb: float) -> list[tuple[str, float]]:
        """Restart every task worker above ``memory_mb``: (task, its MB) of each one restarted."""
        over = [(name, w.rss_mb()) for name, w in self.workers.items()]
        over = [(name, rss) for name, rss in over if rss > memory_mb]
        for name, rss in over:
            self.workers[name].kill(f"task worker over task_memory_mb = {memory_mb:g} ({rss:.0f} MB)")
        return over

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()


@dataclass
class Held:
    """A lease whose episodes are running."""
    lease: dict
    futures: list[Future]
    give_up_at: float
    abandoned: str = ""        # why the registry expired it (then it is given up at once)


class RunnerCore:
    def __init__(self, isolation: Threads | Processes):
        self.isolation = isolation
        self.behaviors: dict[str, dict[int, object]] = {}     # name → {version: function}
        self.payloads: dict[tuple[str, int], dict] = {}       # what task workers load
        self.current: dict[str, int] = {}                     # name → version new leases get
        self.held: dict[str, Held] = {}                       # lease id → its running episodes
        self.hung: list[tuple[str, Future]] = []              # (task, future) given up on
        self.canaries: dict[str, tuple[dict, list[Future]]] = {}    # group id → (its payload, its episodes)

    def install(self, payload) -> tuple[str, str]:
        """Load a version and make it current: ("", "") or (error, traceback)."""
        fn, error, tb = load_behavior(payload)
        if fn is None:
            return error, tb
        versions = self.behaviors.setdefault(payload["name"], {})
        versions[payload["version"]] = fn
        self.payloads[(payload["name"], payload["version"])] = payload
        for old in sorted(versions)[:-KEEP_VERSIONS]:
            if old != payload["version"]:
                del versions[old]
        self.current[payload["name"]] = payload["version"]
        return "", ""

    def start(self, lease: dict) -> list[dict] | None:
        """Run a lease's episodes; its failed results at once if its version is not loaded here."""
        fn = self.behaviors.get(lease["behavior"], {}).get(lease["version"])
        if fn is None:
            return [failed(ep["episode_id"], f"behavior {lease['behavior']} v{lease['version']} "
                           "could not be loaded here") for ep in lease["episodes"]]
        futures = self.isolation.submit(lease, fn, self.payloads[(lease["behavior"], lease["version"])])
        self.held[lease["lease_id"]] = Held(lease, futures, time.monotonic() + float(lease.get("timeout_s", 120.0)))
        return None

    def busy(self) -> int:
        """Episodes running now."""
        return sum(len(h.futures) for h in self.held.values())

    def busy_by_task(self) -> dict[str, int]:
        """Leases running now, per task (process isolation asks for work per task)."""
        busy: dict[str, int] = {}
        for held in self.held.values():
            busy[held.lease["task_name"]] = busy.get(held.lease["task_name"], 0) + 1
        return busy

    def holds(self, lease_id: str) -> bool:
        return lease_id in self.held

    def lease_ids(self) -> list[str]:
        """The leases running now."""
        return list(self.held)

    def drop_other_versions(self, name: str, version: int) -> list[dict]:
        """An upgrade with policy abort: forget the leases of ``name`` at any other version
        (their episodes finish on their own, unread) and return them, to be reported failed."""
        stale = [lid for lid, h in self.held.items() if h.lease["behavior"] == name and h.lease["version"] != version]
        return [self.held.pop(lid).lease for lid in stale]

    def give_up_all(self) -> list[dict]:
        """The runner restarts: every lease it holds, to be reported failed (retried elsewhere)."""
        leases = [h.lease for h in self.held.values()]
        self.held.clear()
        return leases

    def relieve_hung(self, limit: int) -> list[tuple[str, Future]]:
        """Hung episodes that still hold this runner's threads (the isolation frees what it can)."""
        return self.isolation.relieve(self.still_hung(), limit)

    def restart_workers_over(self, memory_mb: float) -> list[tuple[str, float]]:
        return self.isolation.restart_over(memory_mb)

    # -- canaries: a version's trial run, trained on by nothing ------------------------------
    def start_canary(self, payload, lease: dict) -> tuple[str, str]:
        """Run a canary's episodes (``lease``: group_id, tasks, urls, episodes) on a version
        loaded for it alone (not made current), under the same isolation as every episode:
        ("", "") or (error, traceback) if the version does not load."""
        fn, error, tb = load_behavior(payload)
        if fn is None:
            return error, tb
        futures = []
        for task, ep in zip(lease["tasks"], lease["episodes"]):
            one = {**lease, "task": task, "episodes": [ep], "task_name": lease.get("task_name", payload["name"])}
            futures += self.isolation.submit(one, fn, payload)
        self.canaries[lease["group_id"]] = (payload, futures)
        return "", ""

    def finished_canaries(self) -> list[tuple[str, dict, list[dict]]]:
        """(group id, payload, results) of every canary whose episodes all ended."""
        out = []
        for group_id, (payload, futures) in list(self.canaries.items()):
            if all(f.done() for f in futures):
                del self.canaries[group_id]
                out.append((group_id, payload, [f.result() for f in futures]))
        return out

    def abandon(self, lease_id: str, cause: str) -> None:
        """The registry expired this lease: give it back, failed, at the next ``finished``."""
        if lease_id in self.held:
            self.held[lease_id].abandoned, self.held[lease_id].give_up_at = cause[:200], 0.0

    def finished(self) -> list[tuple[dict, list[dict]]]:
        """(lease, results) of every lease that is done or out of time, removed from ``held``."""
        now, out = time.monotonic(), []
        for lease_id, held in list(self.held.items()):
            if now <= held.give_up_at and not all(f.done() for f in held.futures):
                continue
            del self.held[lease_id]
            lease, results = held.lease, []
            for ep, f in zip(lease["episodes"], held.futures):
                if f.done():
                    results.append(f.result())
                else:
                    self.hung.append((lease["task_name"], f))
                    results.append(failed(ep["episode_id"], f"timeout: {held.abandoned}" if held.abandoned else
                                          f"timeout: still running after {float(lease.get('timeout_s', 120)):g} s"))
            for r in results:
                r.pop("traceback", None)
            out.append((lease, results))
        return out

    def still_hung(self) -> list[tuple[str, Future]]:
        """Episodes given up on that are still running (their threads are not free)."""
        self.hung = [(task, f) for task, f in self.hung if not f.done()]
        return self.hung

    def close(self) -> None:
        self.isolation.close()
