"""Which policy-gradient algorithm a model trains with, and its knobs (docs/algorithms.md).

A model entry says ``algorithm = "grpo" | "dr_grpo" | "rloo" | "reinforce_pp" | "gspo" | "ppo"``;
every knob left at its zero value takes that algorithm's default from the paper it comes from
(``ALGORITHM_DEFAULTS``), so ``algorithm = "gspo"`` alone is GSPO as published.  An algorithm
is two choices and a few switches:

    estimator   how an episode's reward becomes an advantage (``episode_advantages``)
                  grpo          (r - mean) / std over the group             (Shao et al. 2024)
                  dr_grpo       r - mean, no std                             (Liu et al. 2025)
                  rloo          r - mean of the *other* members              (Ahmadian et al. 2024)
                  reinforce_pp  r, minus the KL to go when kl_in = reward, then normalized
                                over every token of the batch                (Hu 2025)
                  ppo           GAE over the episode's sampled tokens with a critic
                                (rl/critic.py), rewards on the tokens that earned them
    ratio       per token (PPO-clip), or GSPO's one ratio per sampled sequence (Zheng et al. 2025)
    loss_agg    token-mean | seq-mean-token-sum | seq-mean-token-mean (rl/grpo.py ``term_weights``)
    clip_low / clip_high   the ratio's clip range; clip_high > clip_low is DAPO's clip-higher
    dynamic_sampling       groups whose rewards are all equal are not trained; the batch is
                           refilled from the store (DAPO, Yu et al. 2025)
    tis_cap     > 0: truncated importance sampling between the engine's recorded logprobs and
                the learner's own recompute before the step (Yao et al. 2025)
    kl, kl_estimator, kl_in   a KL penalty to the starting weights: k1 | k2 | k3 (Schulman
                2020), as a loss term or subtracted from the reward
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from statistics import mean, pstdev
from typing import TYPE_CHECKING

from actorjet.errors import UserError

if TYPE_CHECKING:             # no torch at import: rl/batching.py and the store load without it
    import torch

ALGORITHMS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "ppo")
LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
CRITICS = ("trunk", "separate")
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gspo")   # a group whose rewards are equal has no signal

ALGORITHM_DEFAULTS = {
    "grpo": {"loss_agg": "token-mean"},
    "dr_grpo": {"loss_agg": "seq-mean-token-sum"},
    "rloo": {"loss_agg": "token-mean"},
    "reinforce_pp": {"loss_agg": "token-mean"},
    "gspo": {"loss_agg": "seq-mean-token-mean", "clip_low": 3e-4, "clip_high": 4e-4},
    "ppo": {"loss_agg": "token-mean", "lam": 0.95},
}


@dataclass(frozen=True)
class Algorithm:
    """One model's algorithm with every default filled in: what rl/grpo.py's step reads."""
    name: str = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token-mean"
    kl: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    tis_cap: float = 0.0
    dynamic_sampling: bool = False
    gamma: float = 1.0
    lam: float = 1.0
    critic: str = "trunk"
    value_coef: float = 0.5
    critic_lr: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 16384

    @property
    def sequence_ratio(self) -> bool:
        return self.name == "gspo"

    @property
    def token_credit(self) -> bool:
        """Advantages are per token (computed in the step from a first pass over the batch)."""
        return self.name in ("reinforce_pp", "ppo") or (self.kl > 0 and self.kl_in == "reward")


def from_config(cfg: dict) -> Algorithm:
    """A model entry (config.py, already checked) → its Algorithm."""
    name = cfg.get("algorithm", "grpo")
    paper = ALGORITHM_DEFAULTS[name]
    clip = cfg.get("clip", 0.2)
    pick = {k: (cfg.get(k) or paper.get(k) or default) for k, default in
            (("clip_low", clip), ("clip_high", clip), ("loss_agg", "token-mean"), ("lam", 1.0))}
    known = {f.name for f in fields(Algorithm)}
    rest = {k: cfg[k] for k in ("kl", "kl_estimator", "kl_in", "tis_cap", "dynamic_sampling", "gamma", "critic",
                                "value_coef", "critic_lr", "grad_clip") if k in cfg and k in known}
    return Algorithm(name=name, **pick, **rest)


def check(cfg: dict, where: str) -> None:
    """One-line errors for a model entry's algorithm knobs (config.py calls it)."""
    def bad(text):
        raise UserError(f"{where}: {text}")
    if cfg["algorithm"] not in ALGORITHMS:
        bad(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {cfg['algorithm']!r}")
    if cfg["loss_agg"] not in ("", *LOSS_AGGS):
        bad(f"loss_agg must be one of {', '.join(LOSS_AGGS)}, got {cfg['loss_agg']!r}")
    if cfg["kl_estimator"] not in KL_ESTIMATORS:
        bad(f"kl_estimator must be k1, k2 or k3, got {cfg['kl_estimator']!r}")
    if cfg["kl_in"] not in ("loss", "reward"):
        bad(f"kl_in must be loss or reward, got {cfg['kl_in']!r}")
    if cfg["critic"] not in CRITICS:
        bad(f"critic must be trunk (a value head on the policy's trunk) or separate, got {cfg['critic']!r}")
    for key in ("clip", "clip_low", "clip_high", "kl", "tis_cap", "value_coef", "critic_lr"):
        if cfg[key] < 0:
            bad(f"{key} must be >= 0, got {cfg[key]!r}")
    for key in ("gamma", "lam"):
        if not 0 <= cfg[key] <= 1:
            bad(f"{key} must be from 0 to 1, got {cfg[key]!r}")
    algo = from_config(cfg)
    if algo.clip_high < algo.clip_low:
        bad(f"clip_high ({algo.clip_high}) must be >= clip_low ({algo.clip_low}): clip-higher widens the upper bound")
    if not 0 < algo.clip_low < 1:
        bad(f"clip_low must be above 0 and below 1, got {algo.clip_low}")
    if algo.name == "ppo" and cfg.get("learner", {}).get("ranks", 1) > 1:
        bad("algorithm = \"ppo\" trains its critic on one learner rank only for now: drop learner.ranks")


def episode_advantages(algo: Algorithm, rewards: dict[str, float]) -> dict[str, float] | None:
    """Each episode's advantage from its group's rewards, or None when a group estimator finds
    no signal (fewer than two rewards, or all equal).  reinforce_pp and ppo return the rewards
    as they are: their advantages are per token (``token_advantages``)."""
    if algo.name in ("reinforce_pp", "ppo"):
        return dict(rewards)
    values = list(rewards.values())
    if len(values) < 2 or len(set(values)) == 1:
        return None
    mu = mean(values)
    if algo.name in ("grpo", "gspo"):
        sd = pstdev(values)
        return {e: (r - mu) / (sd + 1e-6) for e, r in rewards.items()}
    if algo.name == "dr_grpo":
        return {e: r - mu for e, r in rewards.items()}
    n = len(values)     # rloo: the mean of the others = (n·mu - r) / (n - 1)
    return {e: r - (n * mu - r) / (n - 1) for e, r in rewards.items()}


def kl_estimate(new: torch.Tensor, ref: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from logprobs of tokens sampled from π:
    k1 = log π/π_ref (unbiased, may be negative), k2 = ½ (log π/π_ref)², k3 = π_ref/π - 1 - log π_ref/π
    (unbiased, never negative)."""
    log_ratio = new - ref
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    return (-log_ratio).exp() + log_ratio - 1

