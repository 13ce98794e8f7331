"""From stored GRPO groups to the calls a batch trains on: pure functions, no actor, no HTTP.

    apportion     a batch's groups split between tasks by their weights (cocktail quotas)
    merge_mode    the context tracker's packing mode a model supports (``auto``)
    check_call    is a recorded call trainable (ids, one finite logprob per sampled token)?
    credit        each call gets its episode's group-normalized advantage for its model/role
    next_batch    the learner's pull: claim the next batch's groups from the model's episode
                  store (quotas per task), credit them, pack them — or quarantine the groups
                  that cannot be trained

A test can call these on plain dicts and an in-memory store; no actor, no HTTP.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from actorjet.checks import is_number
from actorjet.rl import pack
from actorjet.rl.calls import full_len
from actorjet.rl.algorithms import GROUP_ESTIMATORS, Algorithm, episode_advantages, from_config
from actorjet.rl.rewards import bad_reward, is_per_turn, reward_for, total


def apportion(total: int, weights: dict[str, float], owed: dict[str, float] | None = None) -> dict[str, int]:
    """Split ``total`` by ``weights`` into integers (largest remainders): 16 at 3:1 → 12 + 4.
    ``owed``: what rounding left each task short of (or over) its share in earlier batches.
    Without it a batch smaller than the weights' resolution starves the minor task for good
    (2 groups at 3:1 rounds to 2 + 0 every step); with it the steps go 2 + 0, 1 + 1, … = 3:1."""
    exact = _shares(total, weights, owed)
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:total - sum(out.values())]:
        out[k] += 1
    return out


def _shares(total: int, weights: dict[str, float], owed: dict[str, float] | None) -> dict[str, float]:
    """Each task's exact (fractional) share of ``total``, debts included, summing to ``total``."""
    w = sum(weights.values())
    exact = {k: max(0.0, total * v / w + (owed or {}).get(k, 0.0)) for k, v in weights.items()}
    scale = total / (sum(exact.values()) or 1.0)        # a clamped debt must not change the total
    return {k: x * scale for k, x in exact.items()}


def settle(cfg: "BatchConfig", groups: list[dict]) -> None:
    """Carry each task's rounding debt to the next batch (see apportion).  A debt is at most
    one group either way: a task that stalled while the others filled its share owes nothing
    for the time it was away."""
    exact = _shares(cfg.groups, cfg.weights, cfg.owed)
    taken = {t: 0 for t in cfg.weights}
    for g in groups:
        if g["task_name"] in taken:
            taken[g["task_name"]] += 1
    cfg.owed = {t: min(1.0, max(-1.0, exact[t] - taken[t])) for t in cfg.weights}


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


def check_call(call: dict) -> None:
    """A recorded call the learner can train on: token ids, one finite logprob per sampled token."""
    if "broken" in call:
        raise ValueError(call["broken"])
    ids, lps = call.get("completion_ids"), call.get("logprobs")
    prompt = call.get("prompt_ids", call.get("new_ids"))
    if not isinstance(prompt, list) or not isinstance(ids, list) or not isinstance(lps, list):
        raise ValueError("a call without prompt_ids / completion_ids / logprobs lists")
    ref = call.get("ref")
    if "prompt_ids" not in call and ref is not None and not 0 <= call.get("prefix_len", -1) <= full_len(ref):
        raise ValueError(f"a call that starts with {call.get('prefix_len')} tokens of a call of {full_len(ref)}")
    if len(ids) != len(lps):
        raise ValueError(f"a call with {len(ids)} completion ids but {len(lps)} logprobs")
    if not all(is_number(x) for x in lps):
        raise ValueError("a call with a logprob that is not a finite number")


def credit(model: str, groups: list[dict], algo: Algorithm = Algorithm()) -> tuple[list, dict]:
    """Each call gets its episode's advantage for this model/role (rl/algorithms.py), with its
    place in the batch and the reward earned at its last token (pack.py ``Credit``); groups
    whose rewards do not vary carry no signal for a group estimator (counted, not trained)."""
    calls, stats = [], {"groups": len(groups), "episodes": 0, "zero_variance_groups": 0, "rewards": [],
                        "by_behavior": {}}
    traj = 0
    for group in groups:
        rewards = group["rewards"]
        for episode_id, reward in rewards.items():     # stored before rewards were checked at the edge
            if bad_reward(reward):
                raise ValueError(f"episode {episode_id}: {bad_reward(reward)}")
        for episode_calls in group["calls"].values():
            for call in episode_calls:
                check_call(call)
        stats["episodes"] += len(rewards)
        credited, mine = {}, {}       # episode → its reward (folded); (episode, reward) → its calls
        for episode_id, episode_calls in group["calls"].items():
            for call in episode_calls:
                r = reward_for(rewards[episode_id], model, call["role"])
                if r is not None:
                    credited.setdefault(episode_id, total(r))
                    mine.setdefault((episode_id, id(r)), (r, []))[1].append(call)   # (one object per role)
        stats["rewards"] += list(credited.values())
        per_task = stats.setdefault("by_task", {}).setdefault(group["task_name"], {
            "groups": 0, "episodes": 0, "reward_sum": 0.0})
        per_task["groups"] += 1
        per_task["episodes"] += len(credited)
        per_task["reward_sum"] += sum(credited.values())
        tag = f"{group['behavior']}@v{group['version']}"
        by = stats["by_behavior"].setdefault(tag, {"episodes": 0, "reward_sum": 0.0})
        by["episodes"] += len(credited)
        by["reward_sum"] += sum(credited.values())
        earned = {key: _per_call(key[0], r, these) for key, (r, these) in mine.items()}
        advantages = episode_advantages(algo, credited) if credited else None
        if advantages is None:
            stats["zero_variance_groups"] += 1
            continue
        for key, (_, these) in mine.items():     # one trajectory: an episode's calls under one reward
            traj += 1
            calls += [(call, pack.Credit(advantages[key[0]], len(calls) + turn, traj, turn, earned[key][turn]))
                      for turn, call in enumerate(these)]
    return calls, stats


def _per_call(episode_id: str, reward, calls: list[dict]) -> list[float]:
    """The reward earned at the end of each call of a trajectory: per-turn rewards on their
    turns, the final (or only) reward on the last call."""
    turns = list(reward["turns"]) if is_per_turn(reward) else []
    if len(turns) > len(calls):
        raise ValueError(f"episode {episode_id}: {len(turns)} per-turn rewards for {len(calls)} turns")
    earned = turns + [0.0] * (len(calls) - len(turns))
    earned[-1] += reward.get("final", 0.0) if is_per_turn(reward) else float(reward)
    return earned


@dataclass
class BatchConfig:
    """What the learner's pull needs to know; ``weights`` (active task → weight) changes
    while training runs (a cocktail's tasks are added, paused, removed)."""
    model: str
    groups: int                                   # groups per batch
    merge: str = "none"                           # context.merge: none | prefix | tree (pack.py)
    max_tokens: int = 4096                        # per packed sequence
    weights: dict = field(default_factory=dict)
    mix: str = "fill"                             # fill | strict (see compose)
    fill_after_s: float = 0.5
    started: float = field(default_factory=time.time)
    prepare: Callable[[list], dict] | None = None  # tokenizer-level repairs before packing → their counts
    algo: Algorithm = Algorithm()                 # the estimator, and dynamic sampling (rl/algorithms.py)
    scanned: int = -1                             # dynamic sampling: pending groups when a refill last fell short
    owed: dict = field(default_factory=dict)      # task → rounding debt carried between batches (settle)


def batch_config(model: str, cfg: dict, train: dict, prepare: Callable | None = None) -> BatchConfig:
    """A model's BatchConfig from its job entry (config.py) and the job's [train] section."""
    return BatchConfig(model, cfg.get("groups_per_step") or train["groups_per_step"], merge=merge_mode(cfg),
                       mix=train.get("mix", "fill"), fill_after_s=float(train.get("fill_after_s", 0.5)),
                       prepare=prepare, algo=from_config(cfg))


def compose(store, cfg: BatchConfig, now: float | None = None) -> dict[str, int] | None:
    """The next batch's share per task (largest remainders of the weights), or None: not yet.
    ``strict`` waits for every task's share; ``fill`` waits only for tasks that completed a
    group in the last ``fill_after_s`` and fills the share of a stalled one with the oldest
    groups of the others, so one task can never starve the learner."""
    pending = store.pending_by_task()
    if sum(n for n, _ in pending.values()) < cfg.groups:
        return None
    if len(cfg.weights) <= 1:
        return {}
    quota = apportion(cfg.groups, cfg.weights, cfg.owed)
    short = [t for t, q in quota.items() if pending.get(t, (0, 0))[0] < q]
    if short:
        now = time.time() if now is None else now
        last = store.last_complete()
        stalled = all(now - (last.get(t) or cfg.started) > cfg.fill_after_s for t in short)
        if cfg.mix == "strict" or not stalled:
            return None
    return quota


def has_signal(model: str, group: dict, algo: Algorithm) -> bool:
    """Does the group train anything (a group estimator's rewards vary)?  A group that cannot be
    credited at all counts as one: building the batch then quarantines it with its cause."""
    if algo.name not in GROUP_ESTIMATORS:
        return True
    try:
        rewards = {}
        for episode_id, episode_calls in group["calls"].items():
            for call in episode_calls:
                if (r := reward_for(group["rewards"][episode_id], model, call["role"])) is not None:
                    rewards.setdefault(episode_id, total(r))
        return episode_advantages(algo, rewards) is not None
    except Exception:  # noqa: BLE001 - judged by build, group by group
        return True


def refill(store, cfg: BatchConfig, groups: list[dict]) -> tuple[list, list] | None:
    """DAPO's dynamic sampling: the claimed groups with signal, topped up with the oldest
    pending ones until there are ``cfg.groups``, and the groups filtered out (consumed by the
    step, never trained).  None, with every group given back: not enough signal yet."""
    keep, drop = [], []
    while True:
        for g in groups:
            (keep if has_signal(cfg.model, g, cfg.algo) else drop).append(g)
        if len(keep) >= cfg.groups:
            return keep, drop
        groups = store.take({}, cfg.groups - len(keep))
        if not groups:
            store.untake([g["group_id"] for g in keep + drop])
            cfg.scanned = sum(n for n, _ in store.pending_by_task().values())
            return None


def build(groups: list[dict], cfg: BatchConfig, filtered: list[dict] = ()) -> dict:
    """Credit and pack claimed groups: the samples of one training step and their stats.
    ``filtered``: groups dynamic sampling consumed without training them."""
    calls, batch = credit(cfg.model, groups, cfg.algo)
    rewards = batch.pop("rewards")
    batch["by_task"] = {t: {"groups": v["groups"], "episodes": v["episodes"],
                            "reward_mean": v["reward_sum"] / max(1, v["episodes"])}
                        for t, v in batch.get("by_task", {}).items()}
    batch["by_behavior"] = {tag: {"episodes": v["episodes"], "reward_mean": v["reward_sum"] / max(1, v["episodes"])}
                            for tag, v in batch["by_behavior"].items()}
    with pack.gc_paused():
        repairs = cfg.prepare(calls) if cfg.prepare and cfg.merge != "none" else {}
        packed = pack.pack(calls, cfg.merge, max_tokens=cfg.max_tokens)
    stats = {**batch, **pack.stats(calls, packed), "merge": cfg.merge, "sequences": len(packed),
             "drift_repairs": 0, "tools_unified": 0, "text_aligned": 0, **repairs,
             "reward_mean": sum(rewards) / max(1, len(rewards)), "created": time.time()}
    if cfg.algo.dynamic_sampling:
        stats["filtered_groups"] = len(filtered)
    return {"samples": [p.to_dict() for p in packed], "stats": stats,
            "group_ids": [g["group_id"] for g in [*groups, *filtered]], "quarantined": [],
            "timeline": [row for g in [*groups, *filtered] for row in g.get("timeline", ())]}


def next_batch(store, cfg: BatchConfig) -> dict | None:
    """Claim, credit and pack the next batch, or None if it is not ready.  If building fails,
    the groups that fail on their own are quarantined with their cause (returned under
    ``quarantined``; the others go back to pending, and the batch has no samples).  A failure
    no single group explains is a bug of ours: raised, with every group back to pending."""
    quota = compose(store, cfg)
    if quota is None:
        return None
    if cfg.algo.dynamic_sampling and sum(n for n, _ in store.pending_by_task().values()) == cfg.scanned:
        return None                       # nothing new since a refill fell short
    groups = store.take(quota, cfg.groups)
    if len(groups) < cfg.groups:          # another reader took some meanwhile: wait
        store.untake([g["group_id"] for g in groups])
        return None
    filtered = []
    if cfg.algo.dynamic_sampling:
        if (kept := refill(store, cfg, groups)) is None:
            return None
        groups, filtered = kept
    ids = [g["group_id"] for g in groups + filtered]
    if len(cfg.weights) > 1:
        settle(cfg, groups + filtered)
    try:
        return build(groups, cfg, filtered)
    except Exception as e:  # noqa: BLE001 - judged group by group below
        culprits = []
        for group in groups:
            try:
                calls, _ = credit(cfg.model, [group], cfg.algo)
                pack.pack(calls, cfg.merge, max_tokens=cfg.max_tokens)
            except Exception as alone:  # noqa: BLE001 - this group is the poison
                culprits.append((group, f"{type(alone).__name__}: {alone}"))
        bad = {g["group_id"] for g, _ in culprits}
        store.untake([g for g in ids if g not in bad])
        if not culprits:
            raise
        for group, cause in culprits:
            store.quarantine(group["group_id"], cause, json.dumps(group["rewards"])[:500])
        return {"samples": None, "stats": {"error": f"{type(e).__name__}: {e}"}, "group_ids": [],
                "quarantined": [(g["group_id"], cause) for g, cause in culprits]}
