"""GRPO loss and optimizer step on packed samples (see actorjet/rl/pack.py).

Loss per sampled token (a *term*):  -min(ratio * A, clip(ratio, 1-ε, 1+ε) * A)
                                     + β * KL(π || π_ref)            (k3 estimator, optional)
with ratio = exp(logπ - logπ_old) against the logprob recorded by the engine (this also
corrects for samples from an older weight version), averaged over all terms of the batch
(token-mean).  A term's logprob is read from the logits at its predecessor's position
(``parents``), which is the previous position in a plain sequence and the parent node in
a packed tree.  Batches are split into micro-batches by token count; the normalization
stays global, so the split does not change the gradient.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class GRPOConfig:
    clip: float = 0.2
    kl: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 16384


# CPU BLAS (MKL, one thread) multiplies matrices of fewer than 16 rows with kernels whose
# rounding differs (~1e-5 on logprobs) from the one used for larger ones.  Padding every
# forward pass (batch x width, the rows of each linear layer) and the LM head input to at
# least MIN_ROWS rows keeps a token's logprob independent of how many tokens travel with it
# (one short call alone vs packed in a tree); a batch of many sequences is never padded.
MIN_ROWS = 16


def collate(samples: list[dict], pad_id: int, device="cpu") -> dict[str, torch.Tensor]:
    """Pad packed samples into tensors; a tree attention mask only when some sample needs one."""
    B = len(samples)
    width = max(-(-MIN_ROWS // B), *(len(s["input_ids"]) for s in samples))
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    pos = torch.zeros((B, width), dtype=torch.long)
    for b, s in enumerate(samples):
        ids[b, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        pos[b, :len(s["position_ids"])] = torch.tensor(s["position_ids"])
    if all(s["linear"] for s in samples):
        mask = torch.zeros((B, width), dtype=torch.long)
        for b, s in enumerate(samples):
            mask[b, :len(s["input_ids"])] = 1
    else:
        mask = torch.eye(width, dtype=torch.bool).repeat(B, 1, 1, 1)   # padding sees itself only
        for b, s in enumerate(samples):
            n = len(s["parents"])
            if s["linear"]:
                mask[b, 0, :n, :n] = torch.ones((n, n), dtype=torch.bool).tril()
                continue
            for i, parent in enumerate(s["parents"]):       # ancestors of i = ancestors of parent + i
                if parent >= 0:
                    mask[b, 0, i] = mask[b, 0, parent]
                mask[b, 0, i, i] = True
    rows = [(b, s["parents"][t.node], s["input_ids"][t.node], t.advantage, t.old_logprob, t.temperature)
            for b, s in enumerate(samples) for t in s["terms"]]
    out = {"input_ids": ids, "position_ids": pos, "attention_mask": mask,
           "term_b": torch.tensor([r[0] for r in rows], dtype=torch.long),
           "term_pred": torch.tensor([r[1] for r in rows], dtype=torch.long),
           "term_tok": torch.tensor([r[2] for r in rows], dtype=torch.long),
           "advantages": torch.tensor([r[3] for r in rows], dtype=torch.float32),
           "old_logprobs": torch.tensor([r[4] for r in rows], dtype=torch.float32),
           "temperatures": torch.tensor([r[5] for r in rows], dtype=torch.float32)}
    return {k: v.to(device) for k, v in out.items()}


def _sharded(model) -> bool:
    """FSDP2 gathers a unit's parameters in its own forward: a sharded model must be called
    whole (its trunk and head called apart would meet sharded embeddings, rl/ranks.py)."""
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def term_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """logπ of every term's token given its ancestors, at its sampling temperature."""
    mask = batch["attention_mask"]
    if mask.dim() == 4:     # additive form: what eager attention expects, and sdpa accepts too
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    head = model.get_output_embeddings()
    plain_head = (head is not None and hasattr(model, "model") and not getattr(model.config, "logit_scale", None)
                  and not getattr(model.config, "final_logit_softcapping", None) and not _sharded(model))
    if plain_head:
        # Only the rows that predict a sampled token go through the LM head: with a large
        # vocabulary (49k for SmolLM2's tokenizer) the full logits tensor is most of the step.
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=mask,
                             position_ids=batch["position_ids"]).last_hidden_state
        picked = hidden[batch["term_b"], batch["term_pred"]]
        n = picked.shape[0]
        if n < MIN_ROWS:
            picked = torch.cat([picked, picked.new_zeros(MIN_ROWS - n, picked.shape[-1])])
        rows = head(picked)[:n]
    else:
        logits = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"]).logits
        rows = logits[batch["term_b"], batch["term_pred"]]
    rows = rows.to(torch.promote_types(rows.dtype, torch.float32)) / batch["temperatures"].unsqueeze(-1)
    return torch.log_softmax(rows, dim=-1).gather(-1, batch["term_tok"].unsqueeze(-1)).squeeze(-1)


def micro_batches(samples: list[dict], max_tokens: int, max_padding: float = 0.3) -> list[list[dict]]:
    """Samples sorted by length, cut into chunks of at most ``max_tokens`` padded tokens,
    and cut early where padding would exceed ``max_padding`` of a chunk's real tokens."""
    order = sorted(samples, key=lambda s: len(s["input_ids"]))
    chunks, current, real = [], [], 0
    for s in order:
        width = len(s["input_ids"])        # the longest so far: the list is sorted
        padded = width * (len(current) + 1)
        if current and (padded > max_tokens or padded > (1 + max_padding) * (real + width)):
            chunks.append(current)
            current, real = [], 0
        current.append(s)
        real += width
    if current:
        chunks.append(current)
    return chunks


def grpo_loss(model, batch: dict, cfg: GRPOConfig, n_terms: float, ref_model=None) -> tuple[torch.Tensor, dict]:
    new = term_logprobs(model, batch)
    ratio = torch.exp(new - batch["old_logprobs"])
    adv = batch["advantages"]
    per_term = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip) * adv)
    kl_value = 0.0
    if ref_model is not None and cfg.kl > 0:
        with torch.no_grad():
            ref = term_logprobs(ref_model, batch)
        log_ratio = ref - new
        kl = torch.exp(log_ratio) - log_ratio - 1
        per_term = per_term + cfg.kl * kl
        kl_value = float(kl.detach().sum())
    loss = per_term.sum() / n_terms
    with torch.no_grad():
        dev = (ratio - 1).abs()
        info = {"clipped": float((dev > cfg.clip).float().sum()), "kl": kl_value, "ratio_dev": float(dev.sum())}
    return loss, info


class BadBatch(ValueError):
    """A batch the learner cannot train on; the step is skipped and its groups quarantined."""


def grpo_step(model, optimizer, samples: list[dict], cfg: GRPOConfig, pad_id: int, ref_model=None,
              ranks=None) -> dict:
    """One optimizer step over all samples (each a packed sample dict).  ``ranks`` (a
    rl/ranks.py RankGroup, the model sharded with ``ranks.shard``): every rank gets all
    samples and trains its share; the step is the one a single rank would take."""
    model.train()
    n_terms = float(sum(len(s["terms"]) for s in samples))
    if n_terms == 0:
        return {"loss": 0.0, "tokens": 0, "sequences": len(samples), "skipped": True}
    optimizer.zero_grad(set_to_none=True)
    total, totals, seq_tokens = 0.0, {"clipped": 0.0, "kl": 0.0, "ratio_dev": 0.0}, 0
    device = next(model.parameters()).device
    chunks = micro_batches(samples, cfg.micro_batch_tokens)
    if ranks is not None:       # this rank's share, padded with empty passes to the busiest rank's count
        from actorjet.rl.ranks import EMPTY, shares
        counts = [len(micro_batches(share, cfg.micro_batch_tokens)) for share in shares(samples, ranks.world)]
        chunks = micro_batches(ranks.share(samples), cfg.micro_batch_tokens)
        chunks += [[EMPTY]] * (max(counts) - len(chunks))
    for chunk in chunks:
        batch = collate(chunk, pad_id, device)
        seq_tokens += sum(len(s["input_ids"]) for s in chunk if s["terms"])
        loss, info = grpo_loss(model, batch, cfg, n_terms, ref_model)
        (loss * ranks.world if ranks is not None else loss).backward()    # FSDP2 averages over ranks
        total += float(loss.detach())
        for k in totals:
            totals[k] += info[k]
    if ranks is not None:
        total, seq_tokens, *sums = ranks.all_sum([total, seq_tokens, *totals.values()])
        totals = dict(zip(totals, sums))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if not (math.isfinite(total) and math.isfinite(float(grad_norm))):
        optimizer.zero_grad(set_to_none=True)      # never let one bad batch turn the weights into NaN
        raise BadBatch(f"non-finite loss ({total}) or gradient norm ({float(grad_norm)}); weights unchanged")
    optimizer.step()
    return {"loss": total, "tokens": int(n_terms), "sequence_tokens": int(seq_tokens), "sequences": len(samples),
            "grad_norm": float(grad_norm), "clip_frac": totals["clipped"] / n_terms,
            "kl": totals["kl"] / n_terms, "ratio_dev": totals["ratio_dev"] / n_terms}
