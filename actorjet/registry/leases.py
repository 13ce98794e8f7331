"""GRPO groups and their leases, inside the registry: issue, retry, re-queue, expire.

A group is ``group_size`` episodes of one task.  It is handed out as one lease (one
message, far below thespian's budget), and it is only ever trained whole.  This desk
never sees a reward: a runner stores its episodes' rewards in every model's episode store
(runner/results.py) and then reports each member as done or failed.  Whether a group is
complete is the store's judgment alone (store/completed.py); the desk decides who runs what:

    member failed            → that member is leased again (up to ``episode_retries`` rounds)
    lease expired / runner   → the lease's members are leased again (same rule)
      died / node lost
    retries used up          → the whole group is dropped, with its cause, never trained in part
    late result              → its lease is gone: rejected, logged, counted — never counted twice
    every member done        → nothing left to lease: the group leaves the desk (counted as
                               ``finished``); the stores hold it whole
    runner dies between      → the group is complete in the store and re-leased here; if the
      storing and reporting    learner took it already it is trained once and the re-run's
                               episodes are ignored (the store only ever hands out a group once)

A client-mode episode (runner/client.py) is a lease too: a lease of one member, opened when
the program opens the episode at a gateway, timed by the same idle and total limits, ended
by the program's /end (done) or /abort (failed: a client's episode is never re-run, so its
group is dropped whole, as any group whose retries are used up).

A plain state object: no actor, no back-pointer.  Each call returns the messages to send, as
(role, message) pairs — ``"gateways"`` (every gateway) — which the episode desk addresses;
the counts go to the registry's one Counters object.

New groups are only issued while fewer than ``groups_per_step * (max_staleness + 1)`` are
untrained: that window bounds how stale a sample can be when the learner sees it.
"""
from __future__ import annotations

import time
from collections import deque

from actorjet import signing
from actorjet.registry.counters import Counters
from actorjet.registry import protocol as proto
from actorjet.runtime.logs import log

Out = list[tuple[object, object]]    # (address or role, message)

GRACE_S = 2.0      # the runner gives up on an episode at its timeout; the registry a little later


def close(episode_ids: list[str], cause: str = "") -> Out:
    """Episodes that will never be trained: every gateway refuses their keys (saying ``cause``)
    and frees their calls."""
    return [("gateways", proto.CloseEpisodes(list(episode_ids), cause))] if episode_ids else []


class LeaseDesk:
    def __init__(self, train: dict, token: str, epoch: int, counters: Counters):
        self.token, self.epoch, self.counters = token, epoch, counters
        self.group_size = train.get("group_size", 8)
        self.window = train.get("groups_per_step", 32) * (train.get("max_staleness", 1) + 1)
        self.idle_limit = float(train.get("lease_timeout_s", 120.0))     # no LLM call for this long
        self.total_limit = float(train.get("episode_max_s", 3600.0))     # however busy
        self.lease_of: dict[str, str] = {}      # episode id → its open lease
        self.max_retries = int(train.get("episode_retries", 2))
        self.groups: dict[str, dict] = {}       # open groups
        self.leases: dict[str, dict] = {}       # lease id → {group_id, members, episodes, runner_id, started, active}
        self.retry: deque = deque()             # (group id, members) waiting for a runner
        self.serial = 0
        self.first_lease_at: float | None = None     # wall time rollouts began (a bench's clock starts here)

    def room(self, source, consumed: dict[str, int], sources: list) -> int:
        """A task's room in the pipeline: its own share of the window (the heaviest task gets
        the whole window), so a task whose groups stall cannot take the room of the others."""
        heaviest = max(s.weight for s in sources)
        window = max(1, round(self.window * source.weight / heaviest))
        outstanding = source.issued - consumed.get(source.name, 0) - self.counters.dropped_by_task.get(source.name, 0)
        return window - outstanding

    # -- issuing --------------------------------------------------------------------------
    def lease(self, sources: list, runner_id: str, max_groups: int, consumed: dict[str, int], urls: dict,
              per_task: int = 0, busy: dict | None = None) -> list[dict]:
        """Retries first (they complete groups already in the pipeline), then new groups.
        ``per_task``: the runner isolates tasks and takes at most that many groups of each."""
        out, busy = [], dict(busy or {})
        fits = lambda task: not per_task or busy.get(task, 0) < per_task  # noqa: E731
        kept = deque()
        while self.retry and len(out) < max_groups:
            group_id, members = self.retry.popleft()
            group = self.groups.get(group_id)
            if group is None:
                continue
            if not fits(group["source"]):
                kept.append((group_id, members))
                continue
            busy[group["source"]] = busy.get(group["source"], 0) + 1
            out.append(self._lease(group, members, runner_id, urls))
        self.retry.extendleft(reversed(kept))
        while len(out) < max_groups:
            source = self._next_source(sources, consumed, fits)
            if source is None:
                break
            busy[source.name] = busy.get(source.name, 0) + 1
            source.issued += 1
            self.counters.issue()
            group_id = f"g{self.epoch}_{self.counters.groups_issued}"
            group = {"group_id": group_id, "source": source.name, "task": next(source.tasks), "size": self.group_size,
                     "behavior": source.behavior, "version": source.version, "done": {}, "attempts": 0}
            self.groups[group_id] = group
            out.append(self._lease(group, list(range(self.group_size)), runner_id, urls))
        return out

    def _next_source(self, sources: list, consumed: dict[str, int], fits=lambda task: True):
        """The active task with room furthest behind its weight's share of the groups issued
        (a deficit round robin: over any stretch, shares follow the weights within one group)."""
        active = [s for s in sources
                  if s.state == "active" and self.room(s, consumed, sources) > 0 and fits(s.name)]
        if not active:
            return None
        total_w = sum(s.weight for s in active)
        total = sum(s.issued for s in active) + 1
        return max(active, key=lambda s: s.weight / total_w * total - s.issued)

    def _lease(self, group: dict, members: list[int], runner_id: str, urls: dict) -> dict:
        self.serial += 1
        lease_id = f"{group['group_id']}~{self.serial}"
        suffix = f"r{group['attempts']}" if group["attempts"] else ""
        episodes = []
        for k in members:
            episode_id = f"{group['group_id']}.{k}{suffix}"
            episodes.append({"episode_id": episode_id, "api_key": signing.mint_key(self.token, episode_id)})
        now = time.time()
        self.first_lease_at = self.first_lease_at or now
        self.leases[lease_id] = {"group_id": group["group_id"], "members": list(members), "episodes": episodes,
                                 "runner_id": runner_id, "started": now, "active": now}
        self.lease_of.update({e["episode_id"]: lease_id for e in episodes})
        self.counters.lease(len(members))
        return {"lease_id": lease_id, "group_id": group["group_id"], "task_name": group["source"],
                "task": group["task"], "urls": urls, "behavior": group["behavior"], "version": group["version"],
                "episodes": episodes, "members": list(members), "group_size": group["size"],
                "timeout_s": self.total_limit, "idle_s": self.idle_limit, "leased_at": now}

    def _drop(self, lease_id: str) -> dict | None:
        lease = self.leases.pop(lease_id, None)
        for e in (lease or {}).get("episodes", []):
            self.lease_of.pop(e["episode_id"], None)
        return lease

    def touch(self, episode_ids: list, now: float | None = None) -> None:
        """These episodes called a model: their leases are alive (an idle limit, not a wall clock)."""
        now = time.time() if now is None else now
        for e in episode_ids:
            lease = self.leases.get(self.lease_of.get(e, ""))
            if lease is not None:
                lease["active"] = now

    # -- results --------------------------------------------------------------------------
    def on_result(self, msg: proto.GroupResult) -> Out:
        lease = self._drop(msg.lease_id)
        if lease is None:
            self.counters.late()
            log.warning("late result for lease %s (expired, or its runner was declared dead): rejected",
                        msg.lease_id)
            return []
        self.counters.back(len(lease["members"]))
        group = self.groups.get(lease["group_id"])
        if group is None:
            return []
        by_id = {r["episode_id"]: r for r in msg.results if isinstance(r, dict) and "episode_id" in r}
        failed, cause, closed = [], "", []
        for k, episode in zip(lease["members"], lease["episodes"]):
            r = by_id.get(episode["episode_id"])
            why = "no result" if r is None else r.get("error")
            if why:
                failed.append(k)
                closed.append(episode["episode_id"])
                cause = _cause(str(why))
            else:
                group["done"][k] = episode["episode_id"]
        out = close(closed, f"it failed: {cause[:200]}")
        done = len(lease["members"]) - len(failed)
        runner = lease["runner_id"]
        self.counters.ran(runner, done)
        if failed:
            retry = not cause.startswith(("upgrade abort", "client abort"))
            out += self._failed(group, failed, cause[:120], retry=retry)
        if group["group_id"] in self.groups and len(group["done"]) == group["size"]:
            self._finish(group)
        return out

    def _failed(self, group: dict, members: list[int], cause: str, retry: bool = True) -> Out:
        self.counters.abort(cause, len(members), task=group["source"])
        if retry and group["attempts"] < self.max_retries:
            group["attempts"] += 1
            self.counters.requeue(len(members))
            self.retry.append((group["group_id"], members))
            return []
        self.groups.pop(group["group_id"], None)
        closed = list(group["done"].values())          # done, but never trained now
        for lease_id, lease in list(self.leases.items()):     # its other members are pointless now
            if lease["group_id"] == group["group_id"]:
                self._drop(lease_id)
                self.counters.back(len(lease["members"]))
                closed += [e["episode_id"] for e in lease["episodes"]]
        self.counters.drop(group["source"], cause)
        log.warning("group %s dropped whole: %s", group["group_id"], cause)
        return close(closed, f"its group was dropped: {cause}")

    def _finish(self, group: dict) -> None:
        self.groups.pop(group["group_id"], None)
        self.counters.complete(group["source"], group["size"])

    # -- client mode: a lease of one member per episode -------------------------------------
    def client_event(self, ev) -> Out:
        """A gateway says a program opened, ended (its reward is in the stores) or aborted an
        episode (ClientEvent)."""
        ev = ev if isinstance(ev, dict) else {}
        episode_id = ev.get("episode_id")
        if not isinstance(episode_id, str):
            return []
        if ev.get("event") == "open":
            size = ev.get("group_size")
            self._open_client(episode_id, ev.get("group"), size if isinstance(size, int) else 1, ev.get("task"))
            return []
        lease_id = self.lease_of.get(episode_id)
        if lease_id is None:
            return []                      # expired already: the gateway refused its key
        error = {"error": "client abort"} if ev.get("event") == "abort" else {}
        return self.on_result(proto.GroupResult("client", lease_id, [{"episode_id": episode_id, **error}]))

    def _open_client(self, episode_id: str, group_key: str | None, size: int, task) -> None:
        group_id = f"c_{group_key or episode_id}"        # as the gateway's store names it
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = {
                "group_id": group_id, "source": "client", "task": task, "size": max(1, size),
                "behavior": "client", "version": 0, "done": {}, "attempts": self.max_retries, "opened": 0}
            self.counters.issue()
        member, group["opened"] = group["opened"], group["opened"] + 1
        lease_id = f"{group_id}~{episode_id}"
        now = time.time()
        self.leases[lease_id] = {"group_id": group_id, "members": [member], "runner_id": "client",
                                 "episodes": [{"episode_id": episode_id}], "started": now, "active": now}
        self.lease_of[episode_id] = lease_id
        self.counters.lease(1)

    # -- failures of runners, nodes and time ---------------------------------------------
    def lost(self, runner_ids: set[str], cause: str) -> Out:
        out: Out = []
        for lease_id, lease in list(self.leases.items()):
            if lease["runner_id"] in runner_ids:
                out += self._expire(lease_id, cause)
        return out

    def tick(self, now: float | None = None) -> Out:
        """Expire leases whose episodes made no LLM call for the idle limit, or ran past the
        total limit (each with a little grace: the runner gives up first and says so)."""
        now, out = (time.time() if now is None else now), []
        for lease_id, lease in list(self.leases.items()):
            if now - lease["active"] > self.idle_limit + GRACE_S:
                out += self._expire(lease_id, f"lease expired (idle): no LLM call for {self.idle_limit:g} s "
                                              "([train] lease_timeout_s)", abandon=True)
            elif now - lease["started"] > self.total_limit + GRACE_S:
                out += self._expire(lease_id, f"lease expired (total limit): the episode ran longer than "
                                              f"{self.total_limit:g} s ([train] episode_max_s)", abandon=True)
        return out

    def _expire(self, lease_id: str, cause: str, abandon: bool = False) -> Out:
        """``abandon``: its runner is alive and may still be running it (a time limit, not a
        lost runner): tell it to give up."""
        lease = self._drop(lease_id)
        if lease is None:
            return []
        if lease["runner_id"] == "client":            # a program's episode, not a runner's lease
            cause, abandon = cause.replace("lease expired", "client expired"), False
        self.counters.back(len(lease["members"]))
        log.warning("lease %s: %s", lease_id, cause)
        out = close([e["episode_id"] for e in lease["episodes"]], cause)
        if abandon:
            out.append((("runner", lease["runner_id"]), proto.AbandonLease(lease_id, cause)))
        group = self.groups.get(lease["group_id"])
        if group is not None:
            out += self._failed(group, lease["members"], cause)
        return out

    def status(self) -> dict:
        return {"issued": self.counters.groups_issued, "leases_open": len(self.leases), "groups_open": len(self.groups),
                "retry_queue": len(self.retry), "first_lease_at": self.first_lease_at}


def _cause(error: str) -> str:
    """The counter an episode's failure goes under (`actorjet status`: aborted_by_cause)."""
    for prefix, cause in (("upgrade abort", "upgrade abort"), ("timeout", "episode timeout"),
                          ("invalid reward", "invalid reward"),
                          ("runner restarted", "runner restarted"), ("worker died", "task worker died"),
                          ("store", "reward not stored"), ("client abort", "client abort")):
        if error.startswith(prefix):
            return error if error.startswith(cause) else f"{cause}: {error}"
    return f"behavior error: {error}"
