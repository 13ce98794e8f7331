"""The merger actor: finished GRPO groups → per-model training batches on disk.

For every group the registry reports done, it collects the recorded calls from each
model's gateway (over HTTP: the data plane), credits each call with its episode's
group-normalized advantage for that model/role, and once ``groups_per_step`` groups are
in, packs the calls (context.merge = none | prefix | tree, see pack.py), writes a batch
file and tells that model's learner.
Groups whose rewards do not vary carry no GRPO signal; they are counted, not trained.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import torch

from actorjet.context import align, pack
from actorjet.context.samples import group_advantages, reward_for
from actorjet.models.openai_api import render_prompt
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.logs import log


def collect_calls(gateway_url: str, token: str, episode_ids: list[str]) -> dict[str, list[dict]]:
    base = gateway_url[:-3] if gateway_url.endswith("/v1") else gateway_url
    req = urllib.request.Request(base + "/internal/collect", data=json.dumps({"episodes": episode_ids}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def merge_mode(model_cfg: dict) -> str:
    """``auto`` = the best the model supports: tree packing needs an attention implementation
    that takes a 4D mask (sdpa, eager); flash-attention models fall back to prefix merging."""
    mode = model_cfg.get("merge", "auto")
    if mode != "auto":
        return mode
    try:
        config = json.loads((Path(model_cfg["path"]) / "config.json").read_text())
    except (OSError, KeyError, json.JSONDecodeError):
        return "prefix"
    return "prefix" if "flash" in str(config.get("_attn_implementation", "")) else "tree"


class Merger(ManagedActor):
    def on_init(self) -> None:
        train = self.context["job"]["train"]
        self.groups_per_step = train["groups_per_step"]
        self.merge_modes = {m["name"]: merge_mode(m) for m in self.context["job"]["models"]}
        self.tree_max_tokens = 4096
        self.tokenizers: dict = {}
        self.services: dict = {}
        self.pending: dict[str, dict] = {}     # model → {"samples": [...], "groups": n, "stats": {...}}
        self.batches = 0
        self.out_dir = Path(self.context["run_dir"]) / "batches"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.groups_log = Path(self.context["run_dir"]) / "groups.jsonl"
        self._announce()

    def _announce(self) -> None:
        self.send(self.registry, m.ServiceUp("", "merger", None, self.myAddress))
        self.send(self.registry, m.Subscribe("directory"))

    def on_context(self) -> None:
        self._announce()

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        self.services = msg.services

    def receiveMsg_GroupDone(self, msg: m.GroupDone, sender):
        group = msg.group
        ids = [e["episode_id"] for e in group["episodes"]]
        rewards = {e["episode_id"]: e["reward"] for e in group["episodes"]}
        with open(self.groups_log, "a") as f:     # which code produced which episodes, for good
            f.write(json.dumps({k: group.get(k) for k in ("group_id", "task_name", "behavior", "version")}
                               | {"rewards": rewards, "t": round(time.time(), 3)}) + "\n")
        for model, svc in self.services.items():
            if "learner" not in svc or "gateway" not in svc:
                continue
            calls = collect_calls(svc["gateway"]["url"], self.context["token"], ids)
            self._add(model, group, calls, rewards)

    def _add(self, model: str, group: dict, calls: dict[str, list[dict]], rewards: dict) -> None:
        batch = self.pending.setdefault(model, {"calls": [], "groups": 0, "episodes": 0, "rewards": [],
                                                "zero_variance_groups": 0, "group_log": []})
        batch["groups"] += 1
        batch["episodes"] += len(rewards)
        # Which code produced these episodes: every group carries its behavior name + version.
        batch["group_log"].append({k: group.get(k) for k in ("group_id", "task_name", "behavior", "version")}
                                  | {"episodes": sorted(rewards)})
        credited = {}
        for episode_id, episode_calls in calls.items():
            for call in episode_calls:
                r = reward_for(rewards[episode_id], model, call["role"])
                if r is not None:
                    credited.setdefault(episode_id, r)
        batch["rewards"] += list(credited.values())
        tag = f"{group.get('behavior')}@v{group.get('version')}"
        by = batch.setdefault("by_behavior", {}).setdefault(tag, {"episodes": 0, "reward_sum": 0.0})
        by["episodes"] += len(credited)
        by["reward_sum"] += sum(credited.values())
        if len(credited) >= 2 and len(set(credited.values())) > 1:
            advantages = group_advantages(credited)
            for episode_id, episode_calls in calls.items():
                if episode_id in advantages:
                    batch["calls"] += [(c, advantages[episode_id]) for c in episode_calls]
        else:
            batch["zero_variance_groups"] += 1
        if batch["groups"] >= self.groups_per_step:
            self._flush(model)

    def _tokenizer(self, model: str):
        if model not in self.tokenizers:
            from transformers import AutoTokenizer

            cfg = next(m for m in self.context["job"]["models"] if m["name"] == model)
            self.tokenizers[model] = AutoTokenizer.from_pretrained(cfg["path"])
        return self.tokenizers[model]

    def _flush(self, model: str) -> None:
        batch = self.pending.pop(model)
        learner = self.services.get(model, {}).get("learner")
        self.batches += 1
        path = self.out_dir / f"{model}-{self.batches:06d}.pt"
        rewards, calls, group_log = batch.pop("rewards"), batch.pop("calls"), batch.pop("group_log")
        batch["by_behavior"] = {tag: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(1, v["episodes"])}
                                for tag, v in batch.get("by_behavior", {}).items()}
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
        torch.save({"model": model, "samples": [p.to_dict() for p in packed], "stats": stats,
                    "groups": group_log}, path)
        if learner is None:
            log.error("batch %s written but model %s has no learner", path, model)
            return
        self.send(learner["address"], m.BatchReady(model, str(path), batch["groups"], stats))
