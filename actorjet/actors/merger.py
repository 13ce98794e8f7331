"""The merger actor: finished GRPO groups → the ledger → per-model training batches.

For every group the registry reports done, it collects the recorded calls from each
model's gateway (over HTTP: the data plane) and commits them to the durable ledger
(actorjet/ledger.py) before acknowledging.  Whenever ``groups_per_step`` groups are
pending for a model, it credits each call with its episode's group-normalized advantage
for that model/role, packs the calls (context.merge = none | prefix | tree, see pack.py),
writes a batch file and tells that model's learner where to fetch it (``GET /batches/NAME``
on this actor's HTTP server, with the cluster token): a learner may run on another node.
The ledger is this actor's alone; learners claim batches and rewind through messages
(Claim → Claimed, Rewind → Rewound).
Groups whose rewards do not vary carry no GRPO signal; they are counted, not trained.
A group that cannot be turned into training data (a reward that cannot be normalized,
calls that cannot be packed, a learner that could not train on it) is quarantined in the
ledger with its cause and counted in status; the rest of the batch trains.  No poison pill:
one bad group never crashes the merger, so it can never crash it again after a restart.
"""
from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import torch

from aiohttp import web

from actorjet.rl import align, batching, pack
from actorjet.ledger import Ledger
from actorjet.serving.openai_api import render_prompt
from actorjet.serving.serve import AppServer
from actorjet.runtime import endpoints
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.logs import log
from actorjet.signing import bearer_ok


TICK_S = 0.2     # re-check the ledger: groups released by a learner, tasks that stalled
STORE_S = 0.02   # finished groups that arrive within this are collected and stored together


def collect_calls(gateway_url: str, token: str, episode_ids: list[str], release: bool = False) -> dict:
    """Read an episode's recorded calls (kept by the gateway), or ``release`` them once the
    ledger holds them."""
    base = gateway_url[:-3] if gateway_url.endswith("/v1") else gateway_url
    body = {"episodes": episode_ids, "close": False, "release": release}
    req = urllib.request.Request(base + "/internal/collect", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60, context=endpoints.client_ssl()) as resp:
        return json.loads(resp.read())


class Merger(ManagedActor):
    def on_init(self) -> None:
        train = self.context["job"]["train"]
        self.groups_per_step = train["groups_per_step"]
        self.mix, self.fill_after_s = train.get("mix", "fill"), float(train.get("fill_after_s", 0.5))
        self.tasks: dict = {}
        self.last_stored: dict[str, float] = {}      # task → when its last group was stored
        self.started = time.time()
        self.trainable = [m["name"] for m in self.context["job"]["models"] if m.get("trainable", True)]
        self.merge_modes = {m["name"]: batching.merge_mode(m) for m in self.context["job"]["models"]}
        self.batch_groups = {m["name"]: m.get("groups_per_step", 0) for m in self.context["job"]["models"]}
        self.tree_max_tokens = 4096
        self.tokenizers: dict = {}
        self.services: dict = {}
        self.batches = 0
        self.incarnation = f"{int(time.time() * 1000) % 10 ** 8:08d}"   # a restarted merger never reuses a file name
        self.learners: dict[str, object] = {}   # model → learner address batches were sent to
        self.run_dir = Path(self.context["run_dir"])
        self.out_dir = self.run_dir / "batches"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.groups_log = self.run_dir / "groups.jsonl"
        self.ledger = Ledger(self.run_dir)
        # episodes in trained groups, per model (status: episodes.trained): counted in full only
        # at start and after a rewind or quarantine; each claim adds its own groups' episodes
        self._recount()
        released = self.ledger.release()     # batches of a previous merger: rebuilt from the ledger
        if released:
            log.info("merger: %d stored groups from unfinished batches are pending again", released)
        self.ticking = False
        self.inbox: list = []          # (GroupDone, sender) waiting to be stored together
        self.server = AppServer(self._batch_app(), name="merger")
        self._announce()

    def _batch_app(self) -> web.Application:
        """Batch files for learners, wherever they run; each is served whole, then deleted
        (a learner that dies after fetching one gets its groups back through Rewind)."""
        async def get(request):
            if not bearer_ok(request.headers.get("Authorization"), self.context["token"]):
                return web.json_response({"error": {"message": "this endpoint needs the cluster token"}}, status=403)
            name = request.match_info["name"]
            path = self.out_dir / name
            if "/" in name or not name.endswith(".pt") or not path.exists():
                return web.json_response({"error": {"message": f"no batch {name!r}"}}, status=404)
            body = path.read_bytes()
            path.unlink(missing_ok=True)
            return web.Response(body=body, content_type="application/octet-stream")

        app = web.Application()
        app.router.add_get("/batches/{name}", get)
        return app

    def on_stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop()
        if getattr(self, "ledger", None):
            self.ledger.close()

    def _announce(self) -> None:
        self.send(self.registry, m.ServiceUp("", "merger", self.server.url, self.myAddress))
        self.send(self.registry, m.Subscribe("directory"))

    def on_context(self) -> None:
        self._announce()

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        self.services = msg.services
        self.tasks = msg.tasks
        for model in self.trainable:
            learner = self.services.get(model, {}).get("learner")
            address = learner["address"] if learner else None
            if model in self.learners and address is not None and address != self.learners[model]:
                # A restarted learner: batches sent to its predecessor (even after it released
                # them at start) would never be trained.  Re-batch them; a learner's claim
                # refuses any batch whose groups were trained already, so nothing trains twice.
                released = self.ledger.release(model)
                log.info("merger: %s has a new learner; %d groups of unfinished batches re-batched",
                         model, released)
            if address is not None:
                self.learners[model] = address
        self._store_inbox()
        self._flush_ready()
        if not self.ticking:          # groups released by a learner or a rewind come back here
            self.ticking = True
            self.wakeupAfter(timedelta(seconds=TICK_S))

    def receiveMsg_Claim(self, msg: m.Claim, sender):
        ok = self.ledger.claim(msg.model, msg.group_ids, msg.step)
        if not ok:
            log.warning("merger: batch %s of %s skipped: some of its groups were trained already", msg.url, msg.model)
            (self.out_dir / msg.url.rpartition("/")[2]).unlink(missing_ok=True)
        self.send(sender, m.Claimed(msg.url, ok))
        if ok:
            self.trained_episodes[msg.model] = (self.trained_episodes.get(msg.model, 0)
                                                + self.ledger.episodes(msg.model, msg.group_ids))
            self._send_counts()

    def receiveMsg_Rewind(self, msg: m.Rewind, sender):
        """A (re)started learner: groups trained after its checkpoint were lost with the weights
        that saw them, and batches sent to its predecessor die with it: pending again."""
        groups = self.ledger.rewind(msg.model, msg.step) + self.ledger.release(msg.model)
        if groups:
            log.info("merger: %s restarts at step %d; %d groups are pending again", msg.model, msg.step, groups)
        self.send(sender, m.Rewound(msg.model, groups))
        self._recount()
        self._flush_ready()

    def _recount(self) -> None:
        self.trained_episodes = {model: c["episodes_trained"] for model, c in self.ledger.counts().items()}
        self._send_counts()

    def _send_counts(self) -> None:
        self.send(self.registry, m.LedgerCounts({model: {"episodes_trained": n}
                                                 for model, n in self.trained_episodes.items()}))

    def receiveMsg_Quarantine(self, msg: m.Quarantine, sender):
        """The learner could not train on a batch: its groups go to quarantine, not back to pending."""
        for group_id in msg.group_ids:
            self._quarantine(msg.model, group_id, msg.cause, "")
        self._recount()           # they had been claimed as trained

    def _quarantine(self, model: str, group_id: str, cause: str, sample: str) -> None:
        log.error("merger: group %s of %s quarantined: %s", group_id, model, cause)
        self.ledger.quarantine(model, group_id, cause, sample)
        self.send(self.registry, m.Quarantined(model, group_id, cause))

    def receiveMsg_WakeupMessage(self, msg, sender):
        if msg.payload == "store":
            self._store_inbox()
            return
        self._flush_ready()
        self.wakeupAfter(timedelta(seconds=TICK_S))

    def receiveMsg_GroupDone(self, msg: m.GroupDone, sender):
        if not self.inbox:
            self.wakeupAfter(timedelta(seconds=STORE_S), payload="store")
        self.inbox.append((msg.group, sender))

    def _store_inbox(self) -> None:
        """Collect → commit to the ledger → release at the gateways → acknowledge, for every
        group that arrived in the last STORE_S together (one HTTP call per gateway and one
        transaction, not one per group).  A crash anywhere before the commit leaves the calls
        at the gateways and the groups unacknowledged, so the registry sends them again to
        the restarted merger."""
        gateways = {model: svc["gateway"]["url"] for model, svc in self.services.items()
                    if "gateway" in svc and model in self.trainable}
        if not self.inbox or set(gateways) != set(self.trainable):
            # Just (re)started: the directory has not arrived yet.  Storing now would commit
            # the groups without their calls; keep them until we know every gateway.
            return
        inbox, self.inbox = self.inbox, []
        ids = [e["episode_id"] for group, _ in inbox for e in group["episodes"]]
        calls = {model: collect_calls(url, self.context["token"], ids) for model, url in gateways.items()}
        items = [(group, {model: {e["episode_id"]: calls[model].get(e["episode_id"], [])
                                  for e in group["episodes"]} for model in gateways})
                 for group, _ in inbox]
        stored = self.ledger.store_many(items)
        now = time.time()
        with open(self.groups_log, "a") as f:     # which code produced which episodes, for good
            for (group, _), new in zip(inbox, stored):
                self.last_stored[group.get("task_name")] = now
                if new:
                    f.write(json.dumps({k: group.get(k) for k in ("group_id", "task_name", "behavior", "version")}
                                       | {"rewards": {e["episode_id"]: e["reward"] for e in group["episodes"]},
                                          "t": round(now, 3)}) + "\n")
        for url in gateways.values():
            collect_calls(url, self.context["token"], ids, release=True)
        acks: list[tuple] = []         # (sender, group ids); addresses are not hashable
        for group, sender in inbox:
            if not acks or acks[-1][0] != sender:
                acks.append((sender, []))
            acks[-1][1].append(group["group_id"])
        for sender, group_ids in acks:
            self.send(sender, m.GroupStored(group_ids))
        self._flush_ready()

    def _flush_ready(self) -> None:
        for model in self.trainable:
            if "learner" not in self.services.get(model, {}):
                continue
            seen: set[tuple] = set()
            while True:
                groups = self._compose(model)
                if not groups:
                    break
                ids = tuple(g["group_id"] for g in groups)
                if ids in seen:            # never spin on a batch that does not go away
                    log.error("merger: batch %s of %s came back unchanged; waiting for the next tick", ids, model)
                    break
                seen.add(ids)
                self._flush(model, groups)

    def _compose(self, model: str) -> list[dict] | None:
        """The next batch: ``groups_per_step`` groups, split between the active tasks by
        their weights (largest remainders).  ``strict`` waits for every task's share;
        ``fill`` waits only for tasks that finished a group in the last ``fill_after_s``, and
        fills the share of a stalled one with the oldest groups of the others, so one task
        can never starve the learner."""
        size = self.batch_groups.get(model) or self.groups_per_step
        pending = self.ledger.pending_by_task(model)
        if sum(n for n, _ in pending.values()) < size:
            return None
        active = {t: v["weight"] for t, v in self.tasks.items() if v.get("state") == "active"}
        if len(active) <= 1:
            return self.ledger.pending(model, size)
        quota = batching.apportion(size, active)
        short = [t for t, q in quota.items() if pending.get(t, (0, 0))[0] < q]
        if short:
            now = time.time()
            stalled = all(now - self.last_stored.get(t, self.started) > self.fill_after_s for t in short)
            if self.mix == "strict" or not stalled:
                return None       # fill only for tasks that finished nothing for fill_after_s
        groups = []
        for task, q in quota.items():
            groups += self.ledger.pending(model, q, task=task)
        if len(groups) < size:       # fill: the oldest groups of any task
            groups += self.ledger.pending(model, size - len(groups), skip=tuple(g["group_id"] for g in groups))
        return groups

    def _tokenizer(self, model: str):
        if model not in self.tokenizers:
            from transformers import AutoTokenizer

            cfg = next(m for m in self.context["job"]["models"] if m["name"] == model)
            self.tokenizers[model] = AutoTokenizer.from_pretrained(cfg["path"])
        return self.tokenizers[model]

    def _flush(self, model: str, groups: list[dict]) -> None:
        """Build and send one batch; if building fails, find the groups that fail on their own
        and quarantine them (the next compose leaves them out).  A failure no single group
        explains is a bug of ours: it crashes the merger as before."""
        try:
            self._build_and_send(model, groups)
        except Exception as e:  # noqa: BLE001 - judged group by group below
            culprits = []
            for group in groups:
                try:
                    calls, _ = batching.credit(model, [group])
                    pack.pack(calls, self.merge_modes.get(model, "none"), max_tokens=self.tree_max_tokens)
                except Exception as alone:  # noqa: BLE001 - this group is the poison
                    culprits.append((group, f"{type(alone).__name__}: {alone}"))
            if not culprits:
                raise
            for group, cause in culprits:
                self._quarantine(model, group["group_id"], cause, json.dumps(group["rewards"])[:500])
            log.warning("merger: a batch of %s failed (%s: %s); %d group(s) quarantined, the rest trains",
                        model, type(e).__name__, e, len(culprits))

    def _build_and_send(self, model: str, groups: list[dict]) -> None:
        self.batches += 1
        path = self.out_dir / f"{model}-{self.context.get('head_epoch', 0)}-{self.incarnation}-{self.batches:06d}.pt"
        calls, batch = batching.credit(model, groups)
        rewards = batch.pop("rewards")
        batch["by_task"] = {t: {"groups": v["groups"], "episodes": v["episodes"],
                                "reward_mean": v["reward_sum"] / max(1, v["episodes"])}
                            for t, v in batch.get("by_task", {}).items()}
        batch["by_behavior"] = {tag: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(1, v["episodes"])}
                                for tag, v in batch["by_behavior"].items()}
        mode = self.merge_modes.get(model, "none")
        cfg = next(m for m in self.context["job"]["models"] if m["name"] == model)
        repairs = tools_unified = text_aligned = 0
        if mode != "none":
            tok = self._tokenizer(model)
            if cfg.get("merge_ignore_tools"):
                tools_unified = align.unify_tools(calls, lambda msgs, tools: render_prompt(tok, msgs, tools))
            if cfg.get("merge_match") == "text":
                text_aligned = align.align_text(calls, lambda ids: tok.decode(
                    ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
            repairs = pack.repair_drift(calls, lambda ids: tok.decode(ids, skip_special_tokens=True))
        packed = pack.pack(calls, mode, max_tokens=self.tree_max_tokens)
        stats = dict(batch, **pack.stats(calls, packed), merge=mode, sequences=len(packed), drift_repairs=repairs,
                     tools_unified=tools_unified, text_aligned=text_aligned,
                     reward_mean=sum(rewards) / max(1, len(rewards)), created=time.time())
        group_ids = [g["group_id"] for g in groups]
        group_log = [{k: g[k] for k in ("group_id", "task_name", "behavior", "version")} for g in groups]
        torch.save({"model": model, "samples": [p.to_dict() for p in packed], "stats": stats,
                    "groups": group_log}, path)
        self.ledger.assign(model, group_ids, path.name)
        learner = self.services[model]["learner"]
        self.send(learner["address"], m.BatchReady(model, f"{self.server.url}/batches/{path.name}", len(groups),
                                                   stats, group_ids))
