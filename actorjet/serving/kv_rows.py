"""Conversations' KV caches as the rows of one batch: stacked to run together, split to keep.

Why: a conversation whose KV cache the engine keeps (serving/prefix_cache.py) must still decode
in the same batch as every other conversation.  Run alone, 16 concurrent SmolLM2 calls decoded
at 12 tokens/s against 59 without kept caches (issue 49): batching is worth more than reuse.
vLLM gets both with paged KV blocks and an attention kernel that reads each sequence's own
blocks; transformers' attention reads one dense ``[rows, heads, columns, dim]`` tensor per layer,
so here each row's kept keys and values are copied into one buffer, left-padded:

    row 0:  .  .  k  k  k  k | .  n  n      k: kept columns, n: this call's new tokens,
    row 1:  k  k  k  k  k  k | n  n  n      .: padding, masked out by the attention mask
    row 2:  .  .  .  .  .  . | .  .  n      (a row without a kept cache: a plain left pad)

Positions are given per row (RoPE rotates by position, not by column), so padding in the
middle of a row is only masked columns.  The copy costs one pass over the kept keys per call,
not per token; what a row keeps afterwards is split out by its unmasked columns.

``ReservedLayer`` holds each layer's buffer with room for the answers reserved up front: a
transformers ``DynamicLayer`` concatenates its whole cache on every decoded token, which costs
O(context) memory traffic per token.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from actorjet.runtime.logs import log

RowKV = list  # one conversation's cache: per layer (keys, values), each [1, heads, tokens, dim]


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in a buffer with room reserved for the
    tokens still to come: ``update`` writes in place (growing by doubling if ever short)
    instead of concatenating.  ``keys``/``values`` are views of the filled columns, so the
    rest of transformers (masks, lengths) sees an ordinary dynamic layer."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, length: int, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.write_at: torch.Tensor | None = None      # fixed shape (StaticDecode): the column to write
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        if keys is not None:
            self.buffers = (keys, values)
            self._view(length)

    def _view(self, length: int) -> None:
        k, v = self.buffers
        self.keys, self.values = k[:, :, :length], v[:, :, :length]
        self.device, self.is_initialized = k.device, True

    def fix(self, write_at: torch.Tensor) -> None:
        """From now on every update writes one column at ``write_at`` (a device tensor the
        decoder advances) and attention reads the whole buffer: each step has the same shapes."""
        self.write_at = write_at
        self.keys, self.values = self.buffers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.write_at is not None:
            self.buffers[0].index_copy_(2, self.write_at, key_states)
            self.buffers[1].index_copy_(2, self.write_at, value_states)
            return self.keys, self.values
        if self.buffers is None:           # nothing kept before: the first update sets the shape
            rows, heads, _, dim = key_states.shape
            self.buffers = tuple(torch.zeros((rows, heads, self.capacity, dim), dtype=s.dtype, device=s.device)
                                 for s in (key_states, value_states))
            self._view(0)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.buffers[0].shape[-2]:
            self.buffers = tuple(_widen(b, max(end, 2 * b.shape[-2])) for b in self.buffers)
        self.buffers[0][:, :, start:end] = key_states
        self.buffers[1][:, :, start:end] = value_states
        self._view(end)
        return self.keys, self.values


class StaticDecode:
    """Decode steps of one fixed shape, so that a GPU can replay them as one CUDA graph.

    Why: the decode loop launches every kernel of every layer from Python, one by one; on an
    8B model that cost ~20 ms a token against a 3.7 ms memory-bandwidth floor (issue 49).  A
    CUDA graph replays the whole step's kernels in one launch, but needs every shape and
    address fixed: so each layer attends over its whole reserved buffer (``ReservedLayer.fix``),
    new keys are written at a column held in a device tensor, and the attention mask is 4D
    (columns not written yet, and padding, masked out), built from device tensors in the step.
    Without a GPU (or if capture fails) the same fixed-shape step runs eagerly."""

    def __init__(self, model, cache: Cache, mask: torch.Tensor, columns: int, rows: int, cache_kw: str,
                 graph: bool):
        self.model, self.cache, self.cache_kw = model, cache, cache_kw
        device = mask.device
        capacity = cache.layers[0].buffers[0].shape[2]
        self.column = torch.tensor([columns], device=device)          # where the next token's keys go
        for layer in cache.layers:
            layer.fix(self.column)
        self.allowed = torch.ones((rows, capacity), dtype=torch.bool, device=device)
        self.allowed[:, :columns] = mask[:, :columns].bool()      # padding stays out; decoded columns come in
        self.index = torch.arange(capacity, device=device)
        self.dtype = next(model.parameters()).dtype
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.graph, self.logits, self.want_graph = None, None, graph

    def _forward(self) -> torch.Tensor:
        visible = self.allowed & (self.index <= self.column)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=visible.device)
        mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)[:, None, None, :]
        out = self.model(input_ids=self.tokens, attention_mask=mask, position_ids=self.positions, use_cache=True,
                         **{self.cache_kw: self.cache})
        return out.logits[:, -1, :].float()

    def _capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):          # warm-up: writes this step's column, as the replay will
            self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The next logits after feeding ``tokens`` ([rows]) at ``positions`` ([rows, 1])."""
        self.tokens.copy_(tokens.unsqueeze(-1))
        self.positions.copy_(positions)
        if self.want_graph and self.graph is None:
            self.want_graph = False
            try:
                self._capture()
            except Exception as e:  # noqa: BLE001 - a model or driver that cannot be captured runs eagerly
                log.warning("engine: decoding without a CUDA graph (%s: %s)", type(e).__name__, str(e)[:200])
                self.graph = None
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits.clone()
        else:
            logits = self._forward()
        self.column += 1
        return logits


def _widen(buffer: torch.Tensor, columns: int) -> torch.Tensor:
    wide = buffer.new_zeros((*buffer.shape[:2], columns, buffer.shape[3]))
    wide[:, :, :buffer.shape[2]] = buffer
    return wide


def stack(rows: list[RowKV | None], lengths: list[int], reserve: int, layers: int) -> tuple[Cache, torch.Tensor]:
    """One batch cache of ``rows`` (None or a kept cache of ``lengths[i]`` tokens), each
    left-padded to the longest, with ``reserve`` more columns of room; and the attention mask
    of its columns ([rows, longest], 1 where a row has a token)."""
    width = max(lengths, default=0)
    sample = next((r for r in rows if r is not None), None)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, width - n:] = 1
    if sample is None:
        return Cache(layers=[ReservedLayer(None, None, 0, reserve) for _ in range(layers)]), mask
    mask = mask.to(sample[0][0].device)
    out = []
    for layer in range(layers):
        buffers = []
        for which in (0, 1):
            ref = sample[layer][which]
            buf = ref.new_zeros((len(rows), ref.shape[1], width + reserve, ref.shape[3]))
            for b, row in enumerate(rows):
                if row is not None and lengths[b]:
                    buf[b, :, width - lengths[b]:width] = row[layer][which][0, :, :lengths[b]]
            buffers.append(buf)
        out.append(ReservedLayer(buffers[0], buffers[1], width, width + reserve))
    return Cache(layers=out), mask


def concat(parts: list[tuple[Cache, torch.Tensor]], reserve: int) -> tuple[Cache, torch.Tensor]:
    """Batch caches of several groups of rows (each with its mask) as one: each left-padded to
    the widest, rows in the order given, with ``reserve`` columns of room."""
    if len(parts) == 1 and _room(parts[0][0]) >= reserve:
        return parts[0]
    width = max(m.shape[1] for _, m in parts)
    masks = [torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m in parts]
    out = []
    for layer in range(len(parts[0][0].layers)):
        buffers = []
        for which in ("keys", "values"):
            pieces = [getattr(c.layers[layer], which) for c, _ in parts]
            rows = sum(p.shape[0] for p in pieces)
            buf = pieces[0].new_zeros((rows, pieces[0].shape[1], width + reserve, pieces[0].shape[3]))
            r = 0
            for p in pieces:
                buf[r:r + p.shape[0], :, width - p.shape[2]:width] = p
                r += p.shape[0]
            buffers.append(buf)
        out.append(ReservedLayer(buffers[0], buffers[1], width, width + reserve))
    return Cache(layers=out), torch.cat(masks)


def _room(cache: Cache) -> int:
    layer = cache.layers[0]
    return layer.buffers[0].shape[2] - layer.keys.shape[2] if layer.buffers else layer.capacity


def repeat_rows(cache: Cache, mask: torch.Tensor, counts: list[int]) -> tuple[Cache, torch.Tensor]:
    """Row i repeated counts[i] times (a request with ``n`` samples decodes n rows from one
    prefill)."""
    if all(c == 1 for c in counts):
        return cache, mask
    index = torch.repeat_interleave(torch.arange(len(counts), device=mask.device),
                                    torch.tensor(counts, device=mask.device))
    out = []
    for layer in cache.layers:
        length = layer.keys.shape[2]
        k, v = (b.index_select(0, index) for b in layer.buffers)
        out.append(ReservedLayer(k, v, length, k.shape[2]))
    return Cache(layers=out), mask.index_select(0, index)


def split(cache: Cache, mask: torch.Tensor, row: int, tokens: int) -> RowKV:
    """Row ``row``'s first ``tokens`` cached tokens, as a kept cache of its own (copied: the
    batch buffer is freed with the batch)."""
    columns = mask[row].nonzero().squeeze(-1)[:tokens]
    return [(layer.keys[row:row + 1].index_select(2, columns), layer.values[row:row + 1].index_select(2, columns))
            for layer in cache.layers]


def nbytes(kv: RowKV) -> int:
    return sum(t.numel() * t.element_size() for pair in kv for t in pair)


def partition(sizes: list[int], fixed: float, weights: list[int] | None = None) -> list[list[int]]:
    """Indices of ``sizes`` in groups that minimise sum(fixed + rows(group) * max(group))
    (``weights``: the rows each index stands for, 1 by default):
    each group runs as one padded batch, so a row costs the group's largest size, and each
    group costs ``fixed`` more (a pass over the weights; the launch of its kernels).  When all
    the padding costs less than one more group, one group it is (the common case).  Otherwise,
    sorted by size, the best groups are runs of distinct sizes: a small dynamic programme."""
    weights = weights or [1] * len(sizes)
    if not sizes or max(sizes) * sum(weights) - sum(s * w for s, w in zip(sizes, weights)) <= fixed:
        return [list(range(len(sizes)))]
    distinct = sorted(set(sizes))
    count = [0] * (len(distinct) + 1)            # count[j]: rows of the j smallest sizes
    for j, s in enumerate(distinct):
        count[j + 1] = count[j] + sum(w for size, w in zip(sizes, weights) if size == s)
    best = [0.0] + [float("inf")] * len(distinct)
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        for i in range(j):
            cost = best[i] + fixed + (count[j] - count[i]) * distinct[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(distinct)
    while j > 0:
        members = set(distinct[cut[j]:j])
        groups.append([i for i, s in enumerate(sizes) if s in members])
        j = cut[j]
    return groups[::-1]
