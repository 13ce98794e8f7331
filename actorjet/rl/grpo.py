"""The policy-gradient step on packed samples (see actorjet/rl/pack.py), for every algorithm
of rl/algorithms.py.

Loss per sampled token (a *term*):
    w_t · IS_t · -min(ρ_t A_t, clip(ρ_t, 1-ε_low, 1+ε_high) A_t)  [+ β KL_t]  [+ c · ½ (V_t - R_t)²]
with ρ_t = π(token)/π_behind(token), where π_behind is the engine's recorded logprob (this also
corrects for samples from an older weight version) or, with ``tis_cap``, the learner's own
recompute before the step, IS_t = min(π_recompute/π_engine, tis_cap) then correcting for the
engine/learner mismatch; GSPO replaces ρ_t by its call's length-normalized sequence ratio.
w_t is the loss aggregation's weight (``term_weights``); the KL term is there with
``kl_in = "loss"``; the value term only with PPO (rl/critic.py).  A term's logprob is read from
the logits at its predecessor's position (``parents``), which is the previous position in a
plain sequence and the parent node in a packed tree.  Batches are split into micro-batches by
token count; the weights are global, so the split does not change the gradient.
"""
from __future__ import annotations

import math

import torch

from actorjet.rl import token_credit
from actorjet.rl.algorithms import Algorithm, kl_estimate

# CPU BLAS (MKL, one thread) multiplies matrices of fewer than 16 rows with kernels whose
# rounding differs (~1e-5 on logprobs) from the one used for larger ones.  Padding every
# forward pass (batch x width, the rows of each linear layer) and the LM head input to at
# least MIN_ROWS rows keeps a token's logprob independent of how many tokens travel with it
# (one short call alone vs packed in a tree); a batch of many sequences is never padded.
MIN_ROWS = 16

# The LM head and log-softmax run over at most this many logits at once (1 GiB of fp32):
# a 32k-token sample of a 150k-vocabulary model would otherwise hold a [tokens x vocabulary]
# tensor of 20 GB, and its gradient beside it.
CHUNK_LOGITS = 2 ** 28


def collate(samples: list[dict], pad_id: int, device="cpu") -> dict[str, torch.Tensor]:
    """Pad packed samples into tensors; a tree attention mask only when some sample needs one.
    Built with whole-tensor ops: with one row op per token, collating the quickstart's
    tree-packed batch took 12 of a learner step's 127 ms (5 now; twice with a first pass)."""
    B = len(samples)
    lengths = [len(s["input_ids"]) for s in samples]
    width = max(-(-MIN_ROWS // B), *lengths)
    rows, cols = _places(lengths)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    pos = torch.zeros((B, width), dtype=torch.long)
    ids[rows, cols] = torch.tensor([t for s in samples for t in s["input_ids"]], dtype=torch.long)
    pos[rows, cols] = torch.tensor([p for s in samples for p in s["position_ids"]], dtype=torch.long)
    if all(s["linear"] for s in samples):
        mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
    else:
        mask = torch.eye(width, dtype=torch.bool).repeat(B, 1, 1, 1)   # padding sees itself only
        for b, s in enumerate(samples):
            n = len(s["parents"])
            if s["linear"]:
                mask[b, 0, :n, :n] = torch.ones((n, n), dtype=torch.bool).tril()
            elif n:
                mask[b, 0, :n, :n] = ancestors(s["parents"])
    rows = [(b, s["parents"][t.node], s["input_ids"][t.node], t.advantage, t.old_logprob, t.temperature, t.call)
            for b, s in enumerate(samples) for t in s["terms"]]
    out = {"input_ids": ids, "position_ids": pos, "attention_mask": mask,
           "term_b": torch.tensor([r[0] for r in rows], dtype=torch.long),
           "term_pred": torch.tensor([r[1] for r in rows], dtype=torch.long),
           "term_tok": torch.tensor([r[2] for r in rows], dtype=torch.long),
           "advantages": torch.tensor([r[3] for r in rows], dtype=torch.float32),
           "old_logprobs": torch.tensor([r[4] for r in rows], dtype=torch.float32),
           "temperatures": torch.tensor([r[5] for r in rows], dtype=torch.float32),
           "term_call": torch.tensor([r[6] for r in rows], dtype=torch.long),
           # sampled at the weights being trained (keep_fresh's stamp; unstamped: every term)
           "term_current": torch.tensor([t.version == s.get("trained_at", t.version)
                                         for s in samples for t in s["terms"]], dtype=torch.bool)}
    for key in PER_TERM:             # what the step added per term (weights, first-pass values)
        if all(key in s for s in samples):
            out[key] = torch.tensor([x for s in samples for x in s[key]], dtype=torch.float32)
    return {k: v.to(device) for k, v in out.items()}


PER_TERM = ("weights", "prox", "ref", "values", "returns", "seq")


def _places(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every token of samples of these lengths, laid out left-aligned."""
    counts = torch.tensor(lengths, dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(lengths)), counts)
    starts = torch.cumsum(counts, 0) - counts
    return rows, torch.arange(int(counts.sum())) - torch.repeat_interleave(starts, counts)


def ancestors(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: row i holds i and every ancestor of i (``parents[i]`` < i, -1 at a root).
    Chain by chain (runs of tokens each the child of the one before): a chain's rows are its
    parent's row plus a lower triangle: a group of 8 answers is 9 block writes, and a
    17,600-token episode with 8 forks takes 0.21 s (one row op per token: 0.27 s; doubling
    pointers along the chain, tried: 2.4 s)."""
    n = len(parents)
    seen = torch.zeros((n, n), dtype=torch.bool)
    steps = torch.arange(n)
    starts = [i for i in range(n) if i == 0 or parents[i] != i - 1] + [n]
    for start, end in zip(starts, starts[1:]):
        if parents[start] >= 0:
            seen[start:end, :parents[start] + 1] = seen[parents[start], :parents[start] + 1]
        torch.ge(steps[:end - start].unsqueeze(1), steps[:end - start], out=seen[start:end, start:end])  # in place
    return seen


def _sharded(model) -> bool:
    """FSDP2 gathers a unit's parameters in its own forward: a sharded model must be called
    whole (its trunk and head called apart would meet sharded embeddings, rl/ranks.py)."""
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def model_mask(model, batch: dict) -> torch.Tensor:
    """The attention mask as the model takes it: additive for a tree (eager expects that, sdpa accepts it)."""
    mask = batch["attention_mask"]
    if mask.dim() == 4:
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def term_logprobs(model, batch: dict[str, torch.Tensor], hidden_out: list | None = None) -> torch.Tensor:
    """logπ of every term's token given its ancestors, at its sampling temperature.
    ``hidden_out``: a list that receives the last hidden state at every term's predecessor."""
    mask = model_mask(model, batch)
    head = model.get_output_embeddings()
    plain_head = (head is not None and hasattr(model, "model") and not getattr(model.config, "logit_scale", None)
                  and not getattr(model.config, "final_logit_softcapping", None) and not _sharded(model))
    if plain_head:
        # Only the rows that predict a sampled token go through the LM head: with a large
        # vocabulary (49k for SmolLM2's tokenizer) the full logits tensor is most of the step.
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=mask,
                             position_ids=batch["position_ids"]).last_hidden_state
        picked = hidden[batch["term_b"], batch["term_pred"]]
        if hidden_out is not None:
            hidden_out.append(picked)
        return chunked_logprobs(head, picked, batch["term_tok"], batch["temperatures"])
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"],
                    output_hidden_states=hidden_out is not None)
        rows = out.logits[batch["term_b"], batch["term_pred"]]
        if hidden_out is not None:
            hidden_out.append(out.hidden_states[-1][batch["term_b"], batch["term_pred"]])
    rows = rows.to(torch.promote_types(rows.dtype, torch.float32)) / batch["temperatures"].unsqueeze(-1)
    return torch.log_softmax(rows, dim=-1).gather(-1, batch["term_tok"].unsqueeze(-1)).squeeze(-1)


def _head_logprobs(head, hidden: torch.Tensor, tokens: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    n = hidden.shape[0]
    if n < MIN_ROWS:
        hidden = torch.cat([hidden, hidden.new_zeros(MIN_ROWS - n, hidden.shape[-1])])
    rows = head(hidden)[:n]
    rows = rows.to(torch.promote_types(rows.dtype, torch.float32)) / temperatures.unsqueeze(-1)
    return torch.log_softmax(rows, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def chunked_logprobs(head, hidden: torch.Tensor, tokens: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """logπ of ``tokens`` from the rows of ``hidden`` through the LM head and a log-softmax, in
    chunks of at most CHUNK_LOGITS logits (each of at least MIN_ROWS rows, zero-padded).  Each chunk is
    recomputed in the backward pass (activation checkpointing) rather than kept, so a long
    sample holds one chunk's logits at a time; a batch that fits in one chunk runs as before."""
    n = hidden.shape[0]
    rows = max(MIN_ROWS, CHUNK_LOGITS // head.weight.shape[0])
    if n <= rows:
        return _head_logprobs(head, hidden, tokens, temperatures)
    from torch.utils.checkpoint import checkpoint

    parts = []
    for start in range(0, n, rows):
        end = min(n, start + rows)
        parts.append(checkpoint(_head_logprobs, head, hidden[start:end], tokens[start:end],
                                temperatures[start:end], use_reentrant=False))
    return torch.cat(parts)


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


def term_weights(samples: list[dict], loss_agg: str) -> list[dict]:
    """Each term's weight in the loss, over the whole batch (so micro-batches and ranks do not
    change it): token-mean 1/T (T sampled tokens); seq-mean-token-sum 1/S (S sampled sequences,
    i.e. calls: Dr. GRPO's constant normalizer); seq-mean-token-mean 1/(S·|call|) (GRPO's
    original form, GSPO's)."""
    keys = [[(t.call, -1) if t.call >= 0 else (-1, si) for t in s["terms"]] for si, s in enumerate(samples)]
    sizes: dict[tuple, int] = {}
    for row in keys:
        for key in row:
            sizes[key] = sizes.get(key, 0) + 1
    n_terms, n_seqs = sum(sizes.values()), len(sizes)
    out = []
    for s, row in zip(samples, keys):
        if loss_agg == "token-mean":
            w = [1.0 / n_terms] * len(row)
        elif loss_agg == "seq-mean-token-sum":
            w = [1.0 / n_seqs] * len(row)
        else:
            w = [1.0 / (n_seqs * sizes[key]) for key in row]
        out.append(dict(s, weights=w))
    return out


def policy_loss(model, batch: dict, algo: Algorithm, ref_model=None, critic=None) -> tuple[torch.Tensor, dict]:
    """The weighted loss of one micro-batch (see the module's docstring) and its sums for the metrics."""
    hidden: list | None = [] if critic is not None else None
    new = term_logprobs(model, batch, hidden)
    behind = batch["prox"] if "prox" in batch else batch["old_logprobs"]
    log_ratio = new - behind
    if algo.sequence_ratio and "seq" in batch:      # GSPO: exp(mean log ratio of the call, over the
        log_ratio = batch["seq"] + new - new.detach()    # whole step: first_pass), its gradient per token
    elif algo.sequence_ratio:
        calls, index = torch.unique(batch["term_call"], return_inverse=True)
        total = torch.zeros(len(calls), dtype=log_ratio.dtype).index_add(0, index, log_ratio.detach())
        count = torch.zeros(len(calls), dtype=log_ratio.dtype).index_add(0, index, torch.ones_like(log_ratio))
        log_ratio = (total / count)[index] + new - new.detach()
    ratio = torch.exp(log_ratio)
    adv, weights = batch["advantages"], batch["weights"]
    per_term = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - algo.clip_low, 1 + algo.clip_high) * adv)
    info = {"clipped": 0.0, "kl": 0.0, "ratio_dev": 0.0, "value_loss": 0.0, "tis_weight": 0.0, "mismatch": 0.0,
            "mismatch_n": 0.0}
    if "prox" in batch:               # truncated importance sampling: learner recompute vs engine
        is_weight = torch.exp(batch["prox"] - batch["old_logprobs"]).clamp(max=algo.tis_cap)
        per_term = per_term * is_weight
        info["tis_weight"] = float(is_weight.sum())
        # engine vs learner at the same weights: a stale token's gap is also the last step's change
        current = batch["term_current"]
        info["mismatch"] = float((batch["prox"] - batch["old_logprobs"]).abs()[current].sum())
        info["mismatch_n"] = float(current.sum())
    if ref_model is not None and algo.kl > 0 and algo.kl_in == "loss":
        with torch.no_grad():
            ref = term_logprobs(ref_model, batch)
        kl = kl_estimate(new, ref, algo.kl_estimator)
        per_term = per_term + algo.kl * kl
        info["kl"] = float(kl.detach().sum())
    loss = (per_term * weights).sum()
    if critic is not None:
        values = critic.values(batch, model_mask(model, batch), hidden[0])
        value_loss = 0.5 * (values - batch["returns"]) ** 2
        loss = loss + algo.value_coef * (value_loss * weights).sum()
        info["value_loss"] = float(value_loss.detach().sum())
    with torch.no_grad():
        dev = (ratio - 1).abs()
        info["clipped"] = float(((ratio < 1 - algo.clip_low) | (ratio > 1 + algo.clip_high)).float().sum())
        info["ratio_dev"] = float(dev.sum())
    return loss, info


class BadBatch(ValueError):
    """A batch the learner cannot train on; the step is skipped and its groups quarantined."""


def first_pass(model, samples: list[dict], algo: Algorithm, pad_id: int, ref_model=None, critic=None,
               chunks: list[list[dict]] | None = None) -> list[dict]:
    """Before the step, without gradients: what the loss needs from the weights as they are —
    the learner's own logprobs (``prox``, for tis_cap), the reference's (``ref``, for KL in the
    reward), the critic's values (``values``, PPO) — then the per-token advantages
    (rl/token_credit.py).  Every rank runs every chunk, so sharded collectives stay in step."""
    wants = {"prox": algo.tis_cap > 0, "ref": algo.kl > 0 and algo.kl_in == "reward" and ref_model is not None,
             "values": critic is not None, "seq": algo.sequence_ratio}
    if not any(wants.values()) and not algo.token_credit:
        return samples
    device = next(model.parameters()).device
    found: dict[int, dict[str, list[float]]] = {}
    with torch.no_grad():
        for chunk in chunks or micro_batches(samples, algo.micro_batch_tokens):
            batch = collate(chunk, pad_id, device)
            hidden: list | None = [] if wants["values"] else None
            new = term_logprobs(model, batch, hidden) if wants["prox"] or wants["values"] or wants["seq"] else None
            got = {"prox": new, "seq": new, "ref": term_logprobs(ref_model, batch) if wants["ref"] else None,
                   "values": critic.values(batch, model_mask(model, batch), hidden[0]) if wants["values"] else None}
            at = 0
            for s in chunk:
                n = len(s["terms"])
                found[id(s)] = {k: v[at:at + n].tolist() for k, v in got.items() if v is not None and wants[k]}
                at += n
    keys = [k for k, on in wants.items() if on and k != "seq"]
    samples = [dict(s, **found[id(s)]) for s in samples]
    if wants["seq"]:
        samples = sequence_log_ratios(samples, wants["prox"])
    if algo.token_credit:
        samples = token_credit.assign(samples, algo, {k: [s[k] for s in samples] for k in keys})
    return samples


def sequence_log_ratios(samples: list[dict], against_prox: bool) -> list[dict]:
    """GSPO's log ratio of each call: the mean over *all* its terms of logπ_new − logπ_behind.
    Packing can put a call's terms in several samples (tree-split carries a shared token's term
    to its first child's sample), and micro-batching or ranks can put those samples in different
    passes: a mean taken per pass saw part of the call (found by test_context's property test:
    a gradient 0.75 away from the unpacked one)."""
    sums: dict[tuple, list[float]] = {}
    keys = [[(t.call, -1) if t.call >= 0 else (-1, si) for t in s["terms"]] for si, s in enumerate(samples)]
    for s, row in zip(samples, keys):
        behind = s["prox"] if against_prox else [t.old_logprob for t in s["terms"]]
        for key, new, old in zip(row, s["seq"], behind):
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += new - old
            acc[1] += 1.0
    return [dict(s, seq=[sums[key][0] / sums[key][1] for key in row]) for s, row in zip(samples, keys)]


def explained_variance(samples: list[dict]) -> float:
    """1 - Var(R - V) / Var(R) over the batch's terms: 0 for a critic that knows nothing (V = 0
    or a constant), 1 for a perfect one; the usual gauge of a PPO critic, which a falling value
    loss is not while the policy, and with it the returns, keep changing."""
    values = torch.tensor([v for s in samples for v in s["values"]], dtype=torch.float64)
    returns = torch.tensor([r for s in samples for r in s["returns"]], dtype=torch.float64)
    spread = returns.var(unbiased=False)
    return float(1 - (returns - values).var(unbiased=False) / spread) if spread > 0 else 0.0


def grpo_step(model, optimizer, samples: list[dict], algo: Algorithm, pad_id: int, ref_model=None,
              ranks=None, critic=None) -> dict:
    """One optimizer step over all samples (each a packed sample dict).  ``ranks`` (a
    rl/ranks.py RankGroup, the model sharded with ``ranks.shard``): every rank gets all
    samples and trains its share; the step is the one a single rank would take.
    ``critic`` (PPO, rl/critic.py): trained in the same backward pass."""
    model.train()
    n_terms = float(sum(len(s["terms"]) for s in samples))
    if n_terms == 0:
        return {"loss": 0.0, "tokens": 0, "sequences": len(samples), "skipped": True}
    samples = term_weights(first_pass(model, samples, algo, pad_id, ref_model, critic), algo.loss_agg)
    optimizer.zero_grad(set_to_none=True)
    if critic is not None:
        critic.optimizer.zero_grad(set_to_none=True)
    total, totals, seq_tokens = 0.0, {}, 0
    device = next(model.parameters()).device
    chunks = micro_batches(samples, algo.micro_batch_tokens)
    if ranks is not None:       # this rank's share, padded with empty passes to the busiest rank's count
        from actorjet.rl.ranks import EMPTY, shares
        counts = [len(micro_batches(share, algo.micro_batch_tokens)) for share in shares(samples, ranks.world)]
        chunks = micro_batches(ranks.share(samples), algo.micro_batch_tokens)
        chunks += [[dict(EMPTY, weights=[])]] * (max(counts) - len(chunks))
    for chunk in chunks:
        batch = collate(chunk, pad_id, device)
        seq_tokens += sum(len(s["input_ids"]) for s in chunk if s["terms"])
        loss, info = policy_loss(model, batch, algo, ref_model, critic)
        (loss * ranks.world if ranks is not None else loss).backward()    # FSDP2 averages over ranks
        total += float(loss.detach())
        for k, v in info.items():
            totals[k] = totals.get(k, 0.0) + v
    if ranks is not None:
        names = sorted(totals)
        total, seq_tokens, *sums = ranks.all_sum([total, seq_tokens, *(totals[k] for k in names)])
        totals = dict(zip(names, sums))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), algo.grad_clip)
    if critic is not None:
        torch.nn.utils.clip_grad_norm_(critic.parameters(), algo.grad_clip)
    if not (math.isfinite(total) and math.isfinite(float(grad_norm))):
        optimizer.zero_grad(set_to_none=True)      # never let one bad batch turn the weights into NaN
        raise BadBatch(f"non-finite loss ({total}) or gradient norm ({float(grad_norm)}); weights unchanged")
    optimizer.step()
    if critic is not None:
        critic.optimizer.step()
    info = {"loss": total, "tokens": int(n_terms), "sequence_tokens": int(seq_tokens), "sequences": len(samples),
            "grad_norm": float(grad_norm), "clip_frac": totals["clipped"] / n_terms,
            "kl": totals["kl"] / n_terms, "ratio_dev": totals["ratio_dev"] / n_terms}
    if critic is not None:        # and how much of the returns' variance the critic explained before the step
        info["value_loss"] = totals["value_loss"] / n_terms
        info["value_explained"] = explained_variance(samples)
    if algo.tis_cap > 0:       # engine vs learner: mean |Δ logprob| and the mean importance weight
        info["logprob_mismatch"] = totals["mismatch"] / totals["mismatch_n"] if totals["mismatch_n"] else None
        info["tis_weight"] = totals["tis_weight"] / n_terms
    return info
