"""Per-token advantages: REINFORCE++'s KL-shaped returns and PPO's GAE, from a first pass.

Group estimators give every token of an episode the same advantage (rl/algorithms.py).  Two
algorithms need more, and both need the episode's sampled tokens *in order*, wherever packing
put them (several packed samples, shared tree nodes):

    reinforce_pp   G_t = Σ_{s≥t} γ^(s-t) r_s, with r_s the reward earned at token s minus
                   β·KL_s when ``kl_in = "reward"``; then normalized over every token of the batch.
    ppo            δ_t = r_t + γ V_{t+1} − V_t,  A_t = Σ (γλ)^l δ_{t+l},  return R_t = A_t + V_t,
                   with V from the critic before the step (rl/critic.py); A normalized over
                   the batch, R the critic's target.
    any estimator  with ``kl_in = "reward"``: A_t = A_episode − β Σ_{s≥t} KL_s (the KL to go).

``r_t`` is zero except on the last token of a call: a per-turn reward there, and the episode's
final reward on its last call's last token (rl/batching.py places them on the terms).  The
terms carry their episode (``traj``), their call's place in it (``turn``) and their place in
the call (``k``), so the order is (turn, k) within a traj.
"""
from __future__ import annotations

import torch

from actorjet.rl.algorithms import Algorithm, kl_estimate


def terms_in_order(samples: list[dict]) -> dict[tuple, list[tuple[int, int]]]:
    """traj → its terms as (sample index, term index), in the order they were sampled."""
    by_traj: dict[tuple, list[tuple]] = {}
    for si, s in enumerate(samples):
        for ti, t in enumerate(s["terms"]):
            key = (0, t.traj) if t.traj >= 0 else (1, t.call, si)    # (no episode known: the call alone)
            by_traj.setdefault(key, []).append((t.turn, t.k, si, ti))
    return {key: [(si, ti) for *_, si, ti in sorted(items)] for key, items in by_traj.items()}


def assign(samples: list[dict], algo: Algorithm, passes: dict[str, list[list[float]]]) -> list[dict]:
    """Samples whose terms carry their per-token advantage; with PPO each sample also gets
    ``returns`` (the critic's targets, one per term).  ``passes``: the first pass's per-term
    values, one list per sample — ``ref`` (the reference model's logprobs, for kl_in = reward)
    and ``values`` (the critic's, for PPO)."""
    order = terms_in_order(samples)
    adv = [[t.advantage for t in s["terms"]] for s in samples]
    returns = [[0.0] * len(s["terms"]) for s in samples]
    shaped = algo.kl > 0 and algo.kl_in == "reward"
    for items in order.values():
        terms = [samples[si]["terms"][ti] for si, ti in items]
        kl = [0.0] * len(items)
        if shaped:
            old = torch.tensor([t.old_logprob for t in terms])
            ref = torch.tensor([passes["ref"][si][ti] for si, ti in items])
            kl = (algo.kl * kl_estimate(old, ref, algo.kl_estimator)).tolist()
        if algo.name == "ppo":
            values = [passes["values"][si][ti] for si, ti in items]
            gae, next_value = 0.0, 0.0
            for j in range(len(items) - 1, -1, -1):
                delta = terms[j].reward - kl[j] + algo.gamma * next_value - values[j]
                gae = delta + algo.gamma * algo.lam * gae
                si, ti = items[j]
                adv[si][ti], returns[si][ti] = gae, gae + values[j]
                next_value = values[j]
            continue
        to_go = 0.0
        for j in range(len(items) - 1, -1, -1):
            si, ti = items[j]
            if algo.name == "reinforce_pp":
                to_go = terms[j].reward - kl[j] + algo.gamma * to_go
                adv[si][ti] = to_go
            else:
                to_go += kl[j]
                adv[si][ti] = terms[j].advantage - to_go
    if algo.name in ("reinforce_pp", "ppo"):
        flat = torch.tensor([a for row in adv for a in row], dtype=torch.float64)
        if flat.numel() > 1:
            mu, sd = flat.mean().item(), flat.std(unbiased=False).item()
            adv = [[(a - mu) / (sd + 1e-8) for a in row] for row in adv]
    out = []
    for s, row, ret in zip(samples, adv, returns):
        new = dict(s, terms=[t._replace(advantage=a) for t, a in zip(s["terms"], row)])
        if algo.name == "ppo":
            new["returns"] = ret
        out.append(new)
    return out
