"""Rewards → advantages → training samples.

Samples are packed samples (actorjet/rl/pack.py): unmerged, one LLM call is one
sample; the context tracker merges calls into fewer, longer ones in the same format.
"""
from __future__ import annotations

from actorjet.rl.rewards import is_per_turn


def reward_for(reward, model: str, role: str):
    """A behavior returns one reward for everyone, or {role_or_model: reward}; a reward is a
    number or per-turn rewards (rl/rewards.py).  None: nothing for this model or role."""
    if isinstance(reward, (int, float)) or is_per_turn(reward):
        return reward
    if isinstance(reward, dict):
        for key in (role, model, "default"):
            if key in reward:
                return reward[key]
    return None


def call_sample(call: dict, advantage: float) -> dict:
    """One recorded call as one training sample (no merging)."""
    from actorjet.rl.pack import pack_none

    return pack_none([(call, advantage)])[0].to_dict()
