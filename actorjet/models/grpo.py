"""GRPO loss and optimizer step on a list of samples (see actorjet/context/samples.py).

Loss per sampled token t:   -min(ratio_t * A_t, clip(ratio_t, 1-ε, 1+ε) * A_t)
                            + β * KL_t(π || π_ref)           (k3 estimator, optional)
with ratio_t = exp(logπ(t) - logπ_old(t)) against the logprob recorded by the engine
(this also corrects for samples from an older weight version), averaged over all
sampled tokens of the batch (token-mean).  Long batches are split into micro-batches by
token count; the normalization stays global, so the split does not change the gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GRPOConfig:
    clip: float = 0.2
    kl: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 16384


def pad(samples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s["input_ids"]) for s in samples)

    def col(key, fill, dtype):
        return torch.tensor([list(s[key]) + [fill] * (width - len(s[key])) for s in samples], dtype=dtype)

    out = {"input_ids": col("input_ids", pad_id, torch.long),
           "attention_mask": torch.tensor([[1] * len(s["input_ids"]) + [0] * (width - len(s["input_ids"]))
                                           for s in samples]),
           "loss_mask": col("loss_mask", 0, torch.float32),
           "old_logprobs": col("old_logprobs", 0.0, torch.float32),
           "advantages": col("advantages", 0.0, torch.float32),
           "temperatures": col("temperatures", 1.0, torch.float32)}
    if "position_ids" in samples[0]:
        out["position_ids"] = col("position_ids", 0, torch.long)
    return out


def token_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """logπ of each token given what precedes it, at its sampling temperature; (B, T), col 0 = 0."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_4d", batch["attention_mask"])}
    if "position_ids" in batch:
        kwargs["position_ids"] = batch["position_ids"]
    logits = model(**kwargs).logits[:, :-1].float()
    logits = logits / batch["temperatures"][:, 1:].unsqueeze(-1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)


def micro_batches(samples: list[dict], max_tokens: int) -> list[list[dict]]:
    order = sorted(samples, key=lambda s: len(s["input_ids"]))
    chunks, current = [], []
    for s in order:
        width = max([len(x["input_ids"]) for x in current] + [len(s["input_ids"])])
        if current and width * (len(current) + 1) > max_tokens:
            chunks.append(current)
            current = []
        current.append(s)
    if current:
        chunks.append(current)
    return chunks


def grpo_loss(model, batch: dict, cfg: GRPOConfig, n_tokens: float, ref_model=None) -> tuple[torch.Tensor, dict]:
    new = token_logprobs(model, batch)
    mask = batch["loss_mask"]
    ratio = torch.exp(new - batch["old_logprobs"])
    adv = batch["advantages"]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip) * adv)
    per_token = -surrogate
    kl_value = 0.0
    if ref_model is not None and cfg.kl > 0:
        with torch.no_grad():
            ref = token_logprobs(ref_model, batch)
        log_ratio = ref - new
        kl = torch.exp(log_ratio) - log_ratio - 1
        per_token = per_token + cfg.kl * kl
        kl_value = float((kl.detach() * mask).sum())
    loss = (per_token * mask).sum() / n_tokens
    with torch.no_grad():
        dev = (ratio - 1).abs()
        info = {"clipped": float(((dev > cfg.clip).float() * mask).sum()), "kl": kl_value,
                "ratio_dev": float((dev * mask).sum())}
    return loss, info


def grpo_step(model, optimizer, samples: list[dict], cfg: GRPOConfig, pad_id: int,
              ref_model=None, prepare=None) -> dict:
    """One optimizer step over all samples.  ``prepare`` may add e.g. tree attention masks."""
    model.train()
    n_tokens = float(sum(sum(s["loss_mask"]) for s in samples))
    if n_tokens == 0:
        return {"loss": 0.0, "tokens": 0, "sequences": len(samples), "skipped": True}
    optimizer.zero_grad(set_to_none=True)
    total, totals = 0.0, {"clipped": 0.0, "kl": 0.0, "ratio_dev": 0.0}
    seq_tokens = 0
    device = next(model.parameters()).device
    for chunk in micro_batches(samples, cfg.micro_batch_tokens):
        batch = {k: v.to(device) for k, v in pad(chunk, pad_id).items()}
        if prepare is not None:
            batch = prepare(chunk, batch)
        seq_tokens += int(batch["attention_mask"].sum())
        loss, info = grpo_loss(model, batch, cfg, n_tokens, ref_model)
        loss.backward()
        total += float(loss.detach())
        for k in totals:
            totals[k] += info[k]
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return {"loss": total, "tokens": int(n_tokens), "sequence_tokens": seq_tokens, "sequences": len(samples),
            "grad_norm": float(grad_norm), "clip_frac": totals["clipped"] / n_tokens,
            "kl": totals["kl"] / n_tokens, "ratio_dev": totals["ratio_dev"] / n_tokens}
