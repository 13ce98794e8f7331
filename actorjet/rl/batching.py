"""From stored GRPO groups to the calls a batch trains on: pure functions, no actor, no HTTP.

    apportion     a batch's groups split between tasks by their weights (cocktail quotas)
    merge_mode    the context tracker's packing mode a model supports (``auto``)
    check_call    is a recorded call trainable (ids, one finite logprob per sampled token)?
    credit        each call gets its episode's group-normalized advantage for its model/role

The merger actor (actors/merger.py) calls these; a test can call them on plain dicts.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from actorjet.rl.rewards import bad_reward
from actorjet.rl.samples import group_advantages, reward_for


def apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split ``total`` by ``weights`` into integers (largest remainders): 16 at 3:1 → 12 + 4."""
    w = sum(weights.values())
    exact = {k: total * v / w for k, v in weights.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:total - sum(out.values())]:
        out[k] += 1
    return out


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
    ids, lps = call.get("completion_ids"), call.get("logprobs")
    if not isinstance(call.get("prompt_ids"), list) or not isinstance(ids, list) or not isinstance(lps, list):
        raise ValueError("a call without prompt_ids / completion_ids / logprobs lists")
    if len(ids) != len(lps):
        raise ValueError(f"a call with {len(ids)} completion ids but {len(lps)} logprobs")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in lps):
        raise ValueError("a call with a logprob that is not a finite number")


def credit(model: str, groups: list[dict]) -> tuple[list, dict]:
    """Each call gets its episode's group-normalized advantage for this model/role;
    groups whose rewards do not vary carry no GRPO signal (counted, not trained)."""
    calls, stats = [], {"groups": len(groups), "episodes": 0, "zero_variance_groups": 0, "rewards": [],
                        "by_behavior": {}}
    for group in groups:
        rewards = group["rewards"]
        for episode_id, reward in rewards.items():     # stored before rewards were checked at the edge
            if bad_reward(reward):
                raise ValueError(f"episode {episode_id}: {bad_reward(reward)}")
        for episode_calls in group["calls"].values():
            for call in episode_calls:
                check_call(call)
        stats["episodes"] += len(rewards)
        credited = {}
        for episode_id, episode_calls in group["calls"].items():
            for call in episode_calls:
                r = reward_for(rewards[episode_id], model, call["role"])
                if r is not None:
                    credited.setdefault(episode_id, r)
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
        if len(credited) >= 2 and len(set(credited.values())) > 1:
            advantages = group_advantages(credited)
            for episode_id, episode_calls in group["calls"].items():
                if episode_id in advantages:
                    calls += [(c, advantages[episode_id]) for c in episode_calls]
        else:
            stats["zero_variance_groups"] += 1
    return calls, stats
