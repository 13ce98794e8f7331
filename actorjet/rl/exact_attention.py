"""An attention kernel whose result does not depend on where a token sits in a batch.

Packed training (actorjet/rl/pack.py) computes a call's tokens inside a longer sequence,
in another order (tree packing interleaves siblings) and next to masked positions.  Float32
attention sums its softmax and value products over rows of different lengths then, in a
different order, and rounds differently: logprobs move by ~1e-5.  This kernel is eager
attention with the scores, softmax and weighted sum of values carried one precision up
(float64 for a float32 model, float32 for bf16/fp16) and rounded back once: the order of the
sums no longer shows, and packed and unmerged calls give bitwise-equal logprobs (measured on
1000 random episodes; see tests/test_context.py).  With ``MIN_ROWS`` padding in grpo.py (for
the BLAS small-matrix kernels) it makes merging provably neutral, at the price of slower
attention: opt in per model with ``attention = "exact"``.
"""
from __future__ import annotations

import torch

NAME = "actorjet_exact"


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: each key/value head serves ``groups`` query heads."""
    if groups == 1:
        return x
    b, heads, t, d = x.shape
    return x[:, :, None].expand(b, heads, groups, t, d).reshape(b, heads * groups, t, d)


def exact_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; returns (output [B, T, H, D], None)."""
    up = torch.float64 if query.dtype == torch.float32 else torch.float32
    groups = getattr(module, "num_key_value_groups", 1)
    key = _repeat_kv(key, groups).to(up)
    value = _repeat_kv(value, groups).to(up)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query.to(up), key.transpose(2, 3)) * scale
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]].to(up)
    weights = torch.softmax(scores, dim=-1)
    if dropout and module.training:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    out = torch.matmul(weights, value).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ``attn_implementation="actorjet_exact"`` loadable (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
