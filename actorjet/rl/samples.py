"""Rewards → advantages → training samples.

Samples are packed samples (actorjet/rl/pack.py): unmerged, one LLM call is one
sample; the context tracker merges calls into fewer, longer ones in the same format.
"""
from __future__ import annotations

from statistics import mean, pstdev


def reward_for(reward, model: str, role: str) -> float | None:
    """A behavior returns one number for everyone, or {role_or_model: number}."""
    if isinstance(reward, (int, float)):
        return float(reward)
    if isinstance(reward, dict):
        for key in (role, model, "default"):
            if key in reward:
                return float(reward[key])
    return None


def group_advantages(rewards: dict[str, float]) -> dict[str, float]:
    """GRPO: each episode's reward minus the group mean, over the group's std."""
    values = list(rewards.values())
    mu, sd = mean(values), pstdev(values)
    return {e: (r - mu) / (sd + 1e-6) for e, r in rewards.items()}


def call_sample(call: dict, advantage: float) -> dict:
    """One recorded call as one training sample (no merging)."""
    from actorjet.rl.pack import pack_none

    return pack_none([(call, advantage)])[0].to_dict()
