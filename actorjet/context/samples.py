"""Training samples: the one format the merger writes and the learner reads.

A sample is a token sequence with per-position arrays:
    input_ids      the tokens
    loss_mask      1 where the token was sampled by the policy (a completion token)
    old_logprobs   the engine's logprob of that token when it was sampled
    advantages     the advantage credited to that token
    temperatures   the temperature it was sampled at (logprobs are recomputed at it)
    versions       the weight version that produced it (-1 on prompt tokens)
Unmerged, one LLM call becomes one sample; the context tracker (actorjet/context/)
merges calls into fewer, longer samples in this same format.
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
    """One recorded call as one sample (no merging)."""
    n_prompt, n_out = len(call["prompt_ids"]), len(call["completion_ids"])
    return {
        "input_ids": list(call["prompt_ids"]) + list(call["completion_ids"]),
        "loss_mask": [0] * n_prompt + [1] * n_out,
        "old_logprobs": [0.0] * n_prompt + list(call["logprobs"]),
        "advantages": [0.0] * n_prompt + [advantage] * n_out,
        "temperatures": [1.0] * n_prompt + [call["temperature"] if call["temperature"] > 0 else 1.0] * n_out,
        "versions": [-1] * n_prompt + [call["weight_version"]] * n_out,
    }
