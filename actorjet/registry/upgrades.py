"""Live code iteration inside the registry: upgrade, canary, rollback, who runs what.

    actorjet upgrade NAME file.py:fn   → Upgrade     → check signature → store version
        --canary N                     → Canary to one runner → CanaryResult ok? else refuse
                                       → activate: every live runner gets BehaviorUpdate
    runners                            → BehaviorLoaded (the version they now run)
    actorjet rollback NAME [--to V]    → Rollback    → activate an older stored version

The registry never unpickles code: it checks the uploader's HMAC, stores the bytes
(behavior_store.py) and re-signs them with the version number for the runners, which
verify before loading.  Versions are never reused, so a label on an episode always names
exactly one piece of code.

A plain state object: it holds the task sources it upgrades (shared with the episode desk)
and the behavior store; who the live runners are comes with each call (``runners``: runner
id → address), and each call returns the messages to send as (address, message) pairs.
"""
from __future__ import annotations

import time

from actorjet import signing
from actorjet import behaviors
from actorjet.registry.behavior_store import BehaviorStore
from actorjet.registry import protocol as proto
from actorjet.runtime.logs import log

Out = list[tuple[object, object]]

POLICIES = ("finish", "abort")


class UpgradeDesk:
    def __init__(self, token: str, store: BehaviorStore, sources: list):
        self.token, self.store, self.sources = token, store, sources
        self.canaries: dict[str, dict] = {}     # behavior name → the canary in progress
        self.load_errors: dict[tuple, dict] = {}
        self.pushes: list[dict] = []            # one per activation: when, to whom, acks
        self.runner_versions: dict[str, dict] = {}   # runner id → {task: version it runs}

    def source(self, name):
        return next((s for s in self.sources if s.name == name), None)

    @staticmethod
    def _reply(to, **kw) -> Out:
        return [(to, proto.UpgradeReply(**kw))] if to is not None else []

    # -- upgrade ------------------------------------------------------------------------
    def upgrade(self, msg: proto.Upgrade, sender, runners: dict, urls: dict) -> Out:
        upload = msg.upload
        name = upload.get("name") if isinstance(upload, dict) else None
        reason = behaviors.check_upload(self.token, upload)
        if reason:
            log.warning("upgrade of %s refused: %s", name, reason)
            return self._reply(sender, ok=False, name=str(name), error=f"upload refused: {reason}")
        source = self.source(name)
        error = (f"no task named {name!r} (tasks: {', '.join(s.name for s in self.sources) or 'none'})"
                 if source is None else
                 f"policy must be one of {', '.join(POLICIES)}" if msg.policy not in POLICIES else
                 f"an upgrade of {name!r} is already in its canary" if name in self.canaries else "")
        if error:
            return self._reply(sender, ok=False, name=name, error=error)
        store = self.store
        version = store.add(name, upload["blob"], upload.get("source", ""))
        payload = behaviors.sign(self.token, name, version, upload["blob"])
        if msg.canary <= 0:
            return self._activate(name, version, msg.policy, sender, runners)
        runner = next(iter(runners), None)
        if runner is None:
            store.mark(name, version, "refused", "no live runner to run the canary on")
            return self._reply(sender, ok=False, name=name, version=version,
                               error="no live runner to run the canary on; join a node or pass --canary 0")
        group_id = f"canary_{version}_{int(time.time() * 1000)}"     # key-safe characters only
        episodes = [{"episode_id": f"{group_id}.{k}", "api_key": signing.mint_key(self.token, f"{group_id}.{k}")}
                    for k in range(msg.canary)]
        lease = {"group_id": group_id, "tasks": [next(source.tasks) for _ in episodes],
                 "urls": urls, "episodes": episodes}
        self.canaries[name] = {"version": version, "policy": msg.policy, "reply_to": sender,
                               "runner_id": runner, "deadline": time.time() + msg.timeout_s}
        log.info("canary of %s v%d: %d episodes on %s", name, version, msg.canary, runner)
        return [(runners[runner], proto.Canary(payload, lease))]

    def canary_result(self, msg: proto.CanaryResult, runners: dict) -> Out:
        canary = self.canaries.get(msg.name)
        if canary is None or canary["version"] != msg.version:
            return []               # timed out already
        del self.canaries[msg.name]
        if msg.ok:
            log.info("canary of %s v%d passed on %s (rewards %s)", msg.name, msg.version, msg.runner_id, msg.rewards)
            return self._activate(msg.name, msg.version, canary["policy"], canary["reply_to"], runners)
        return self._refuse(msg.name, canary, f"canary failed on {msg.runner_id}: {msg.error}", msg.traceback)

    def _refuse(self, name: str, canary: dict, error: str, tb: str = "") -> Out:
        self.store.mark(name, canary["version"], "refused", error + "\n" + tb)
        log.warning("upgrade of %s v%d refused: %s", name, canary["version"], error)
        current = self.source(name).version
        return self._reply(canary["reply_to"], ok=False, name=name, version=canary["version"],
                           error=f"{error}; v{current} keeps running", traceback=tb)

    def tick(self) -> Out:
        now, out = time.time(), []
        for name, canary in list(self.canaries.items()):
            if canary["deadline"] < now:
                del self.canaries[name]
                out += self._refuse(name, canary, "the canary did not finish in time")
        return out

    # -- rollback -----------------------------------------------------------------------
    def rollback(self, msg: proto.Rollback, sender, runners: dict) -> Out:
        source = self.source(msg.name)
        if source is None:
            return self._reply(sender, ok=False, name=msg.name, error=f"no task named {msg.name!r}")
        store = self.store
        to = msg.to if msg.to is not None else store.previous(msg.name)
        entry = store.entry(msg.name, to) if to is not None else None
        error = ("there is no earlier version to roll back to" if to is None else
                 f"{msg.name} has no version {to} (versions: "
                 f"{', '.join(str(v['version']) for v in store.index(msg.name)['versions'])})" if entry is None else
                 f"v{to} was refused ({entry.get('note', '').splitlines()[0] if entry.get('note') else ''}); "
                 "upgrade with fixed code instead" if entry["state"] == "refused" else "")
        if error:
            return self._reply(sender, ok=False, name=msg.name, error=error)
        if to == source.version:        # already there: a rollback is idempotent (scripts can repeat it)
            return self._reply(sender, ok=True, name=msg.name, version=to)
        return self._activate(msg.name, to, msg.policy, sender, runners)

    # -- activation and acknowledgements -----------------------------------------------
    def _activate(self, name: str, version: int, policy: str, reply_to, runners: dict) -> Out:
        self.store.activate(name, version)
        source = self.source(name)
        source.set_version(version, self.store.blob(name, version))
        out: Out = [(address, proto.BehaviorUpdate(source.payload, policy)) for address in runners.values()]
        self.pushes.append({"name": name, "version": version, "at": time.time(), "runners": list(runners),
                            "acked": {}})
        self.pushes = self.pushes[-50:]
        log.info("%s v%d is current; pushed to %d runners (policy %s)", name, version, len(runners), policy)
        return out + self._reply(reply_to, ok=True, name=name, version=version, runners=list(runners))

    def behavior_loaded(self, msg: proto.BehaviorLoaded) -> Out:
        if msg.error:
            self.load_errors[(msg.name, msg.version)] = {"runner": msg.runner_id, "error": msg.error}
            log.error("%s could not load %s v%d: %s", msg.runner_id, msg.name, msg.version, msg.error)
            return []
        self.runner_versions.setdefault(msg.runner_id, {})[msg.name] = msg.version
        for push in reversed(self.pushes):
            if push["name"] == msg.name and push["version"] == msg.version:
                push["acked"].setdefault(msg.runner_id, time.time() - push["at"])
                break
        return []

    # -- status -------------------------------------------------------------------------
    def status(self, placed: list[str]) -> list[dict]:
        """Per task: its versions and how many of the ``placed`` runners run each."""
        out = []
        for source in self.sources:
            index = self.store.index(source.name)
            counts: dict[int, int] = {}
            for runner_id in placed:
                v = self.runner_versions.get(runner_id, {}).get(source.name)
                if v is not None:
                    counts[v] = counts.get(v, 0) + 1
            versions = [{"version": v["version"], "state": v["state"], "source": v.get("source", ""),
                         "runners": counts.get(v["version"], 0),
                         "load_error": self.load_errors.get((source.name, v["version"]), {}).get("error", "")}
                        for v in index["versions"]]
            out.append({"name": source.name, "version": source.version,
                        "runners": counts.get(source.version, 0), "versions": versions,
                        "canary": source.name in self.canaries})
        return out

    def push_report(self) -> list[dict]:
        """Per activation: how long until each live runner ran it (bench/upgrade.py reads this)."""
        return [{"name": p["name"], "version": p["version"], "runners": p["runners"],
                 "acked_s": dict(p["acked"])} for p in self.pushes]
