"""Client-mode episodes inside the registry: opened and ended at a gateway, timed like leases.

A program that drives episodes itself (runner/client.py) opens them at a gateway, which tells
the registry (``ClientEvent``).  This desk counts them, groups their rewards as the gateways
stored them, and expires the ones that make no LLM call for the idle limit or stay open past
the total limit (the lease desk's limits, so both kinds of episode are timed alike).  A plain
state object, like the lease desk: each call returns the messages to send.
"""
from __future__ import annotations

import time

from actorjet.registry.counters import Counters
from actorjet.registry.leases import LeaseDesk, Out, close
from actorjet.rl.rewards import bad_reward
from actorjet.runtime.logs import log


class ClientDesk:
    def __init__(self, counters: Counters, leases: LeaseDesk):
        self.counters, self.leases = counters, leases
        self.groups: dict[str, list] = {}     # client-mode group → ended episodes
        self.open: dict[str, dict] = {}       # episode → its open event, opened_at, active_at

    def touch(self, episode_ids: list[str], now: float) -> None:
        for e in episode_ids:
            if e in self.open:
                self.open[e]["active_at"] = now

    def expire(self, now: float | None = None) -> Out:
        """A client-mode episode with no LLM call for lease_timeout_s, or open longer than
        episode_max_s (its user crashed or forgot it), is aborted and closed: its key stops
        working, with the cause, and its calls are freed."""
        now = time.time() if now is None else now
        idle, total = self.leases.idle_limit, self.leases.total_limit
        out: Out = []
        for episode_id, ev in list(self.open.items()):
            if now - ev.get("active_at", ev["opened_at"]) > idle:
                cause = f"client expired (idle): no LLM call for {idle:g} s ([train] lease_timeout_s)"
            elif now - ev["opened_at"] > total:
                cause = f"client expired (total limit): open longer than {total:g} s ([train] episode_max_s)"
            else:
                continue
            del self.open[episode_id]
            self.counters.in_flight -= 1
            self.counters.abort(cause)
            log.warning("client episode %s: %s", episode_id, cause)
            out += close([episode_id], cause)
        return out

    def on_event(self, ev: dict) -> Out:
        if ev["event"] == "open":
            self.open[ev["episode_id"]] = dict(ev, opened_at=time.time())
            self.counters.in_flight += 1
            return []
        opened = self.open.pop(ev["episode_id"], None)
        if opened is None:
            return []
        self.counters.in_flight -= 1
        why = "client abort" if ev["event"] == "abort" else bad_reward(ev.get("reward"))
        if why:           # (the gateway refused bad rewards already; this is the inner check)
            self.counters.abort(why)
            return close([ev["episode_id"]], why)
        self.counters.completed += 1
        group_key = opened.get("group") or ev["episode_id"]
        size = int(opened.get("group_size") or 1)
        members = self.groups.setdefault(group_key, [])
        members.append({"episode_id": ev["episode_id"], "reward": ev["reward"]})
        if len(members) < size:
            return []
        del self.groups[group_key]       # complete in the stores already (the gateways wrote it)
        self.counters.groups_issued += 1
        self.counters.groups_finished += 1
        return []
