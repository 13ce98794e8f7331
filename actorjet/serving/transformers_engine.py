"""The transformers inference engine: batched sampling that returns token ids and logprobs.

Why a hand-written sampling loop instead of ``model.generate``: every request in a batch
may have its own temperature, top_p, length, stop strings and seed, and training needs
the exact log-probability of every sampled token.  The loop is short: left-pad the
prompts, run the prompt once, then one token per step with the KV cache.

Requests that arrive close together are generated together (serving/batching_engine.py),
each conversation resuming its kept KV cache (serving/prefix_cache.py) in the same batch as
the others (serving/kv_rows.py).

Logprobs are taken under softmax(logits / temperature) — the distribution that was
sampled, before top_p truncation — so the learner can recompute them exactly; greedy
requests (temperature 0) record logprobs at temperature 1.
"""
from __future__ import annotations

import inspect
import time
from array import array
from collections import Counter
from pathlib import Path

import torch

from actorjet.rl.calls import common_prefix
from actorjet.runtime.logs import log
from actorjet.serving import kv_rows, weights
from actorjet.serving.batching_engine import BatchingEngine, GenRequest, GenResult  # noqa: F401 - what engines return
from actorjet.serving.prefix_cache import MIN_TOKENS, PrefixCache

# A prefill sub-batch costs about this many tokens' work more (a pass over the weights, the
# launch of its kernels): new-token counts are padded together unless that wastes more.
PREFILL_FIXED_TOKENS = 256
# A CUDA graph is captured for a batch's decode steps when it has more than this many: the
# capture costs about two steps.
GRAPH_MIN_STEPS = 8


class TransformersEngine(BatchingEngine):
    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu", dtype: str = "float32",
                 max_batch: int = 64, window_s: float = 0.004, seed: int = 0,
                 model=None, tokenizer=None, start_thread: bool = True, crash_on_thread_death: bool = False,
                 lora: dict | None = None, adapters: dict[str, dict] | None = None, prefix_cache_mb: float = -1,
                 gpu_share: float = 0.92, name: str = "", static_decode: bool | None = None):
        """Load ``model_dir``, or wrap an already loaded ``model``/``tokenizer`` (the learner
        evaluates its own weights this way, with ``start_thread=False``).  ``lora``: serve the
        base with an adapter (rl/lora.py); published versions are then adapters.
        ``adapters``: more adapters over the same base, by name (their lora tables): the
        models of the job that share this one's base.  ``prefix_cache_mb``: memory for the KV
        caches of conversations between their calls (serving/prefix_cache.py; 0: none; -1: from
        the device: 1024 on the CPU, on a GPU ``gpu_share`` of it less the weights and a batch's
        activations, reserved once: runtime/gpu_memory.py).  ``name``: the model's, for errors.
        ``static_decode``: decode steps of fixed shape, replayed as CUDA graphs (kv_rows.StaticDecode;
        default: on a GPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir)
        loaded = model is None
        if loaded:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.peft = None
        if lora:
            from actorjet.rl.lora import attach, peft_config
            self.peft = attach(model, lora)
            for name, cfg in (adapters or {}).items():
                self.peft.add_adapter(name, peft_config(cfg))
            model = self.peft.get_base_model()
        if loaded:
            model.to(self.device).eval()
        self.model = model
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        # transformers renamed `past_key_values` to `cache` in 5.x; support both.
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        # A prefill needs the last position's logits only: without this a 32k-token prompt of a
        # 150k-vocabulary model would compute (and hold) 32k x 150k logits.
        keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._last_logits = {"logits_to_keep": 1} if keep else {}
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._config = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") \
            else self.model.config
        self._weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.prefix_cache = PrefixCache(self._kv_budget(prefix_cache_mb, gpu_share, max_batch, name))
        self.static_decode = self.device.type == "cuda" if static_decode is None else static_decode
        self._layers, self._decode_fixed = self._config.num_hidden_layers, self._decode_pass_tokens()
        self._start_batching(max_batch, window_s, start_thread, crash_on_thread_death=crash_on_thread_death)
        self.versions.update(dict.fromkeys(adapters or {}, 0))

    def _kv_budget(self, asked_mb: float, gpu_share: float, max_batch: int, name: str) -> float:
        """The kept caches' budget in MB, reserved once on a GPU (runtime/gpu_memory.py)."""
        if asked_mb >= 0:
            return asked_mb
        if self.device.type != "cuda":
            return 1024.0
        from actorjet.runtime import gpu_memory

        headroom = gpu_memory.headroom_bytes(self._config, max_batch, next(self.model.parameters()).element_size())
        budget = gpu_memory.kv_budget_mb(gpu_memory.total_bytes(str(self.device)), gpu_share, self._weight_bytes,
                                         headroom, name, str(self.device))
        gpu_memory.reserve(str(self.device), int(budget * 2 ** 20 + headroom))
        return budget

    def _decode_pass_tokens(self) -> float:
        """What one more decode batch costs in KV tokens: a decode step reads every weight
        once and each row's keys and values, so padding a short conversation to a long one's
        width is cheaper than a second pass until it reads as many bytes as the weights (at
        least 1024 tokens: the launch overhead)."""
        config = self._config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * next(self.model.parameters()).element_size()
        return max(1024.0, self._weight_bytes / per_token)

    def _eos_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config else None
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def _load(self, path: str, adapter: str = "") -> None:
        t0 = time.perf_counter()
        targets = self.model.state_dict()
        if adapter:         # the learner's file names the adapter "default"; here it has its model's name
            from actorjet.rl.lora import ADAPTER
            targets = {k.replace(f".{adapter}.", f".{ADAPTER}."): v for k, v in targets.items() if f".{adapter}." in k}
        size = weights.load_into(targets, path)
        log.info("engine: loaded %s (%.1f MB) in %.3f s", Path(path).name, size / 1e6, time.perf_counter() - t0)

    # -- the sampling loop --------------------------------------------------------------
    def _generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        """One batch per adapter (a LoRA layer applies one adapter to a whole batch)."""
        names = sorted({r.adapter for r in reqs})
        for name in names:
            if name not in self.versions:
                raise ValueError(f"this engine serves no adapter {name!r}")
        if len(names) == 1:
            return self._generate_with(names[0], reqs)
        out: list = [None] * len(reqs)
        for name in names:
            idx = [i for i, r in enumerate(reqs) if r.adapter == name]
            for i, res in zip(idx, self._generate_with(name, [reqs[i] for i in idx])):
                out[i] = res
        return out

    def _cacheable(self, req: GenRequest) -> bool:
        return bool(req.cache_key) and req.n == 1 and len(req.prompt_ids) >= MIN_TOKENS and \
            self.prefix_cache.budget > 0

    def _generate_with(self, adapter: str, reqs: list[GenRequest]) -> list[list[GenResult]]:
        """All requests decode together, each resuming its conversation's kept KV cache where
        it has one.  Rows of very different lengths run as separate batches only when the
        padding would cost more than another pass over the weights (kv_rows.partition)."""
        if self.peft is not None and len(self.peft.peft_config) > 1:
            from actorjet.rl.lora import ADAPTER
            self.peft.set_adapter(adapter or ADAPTER)
        self.batches += 1
        for r in reqs:                   # the gateway hands over its int32 array: listed here, off its loop
            if not isinstance(r.prompt_ids, list):
                r.prompt_ids = list(r.prompt_ids)
        version = self.versions[adapter]
        kept = [self.prefix_cache.take(r.cache_key, r.prompt_ids, version, adapter) if self._cacheable(r)
                else (None, 0) for r in reqs]
        kept = self._share_prefixes(reqs, kept)
        out: list = [None] * len(reqs)
        for group in kv_rows.partition([len(r.prompt_ids) for r in reqs], self._decode_fixed, [r.n for r in reqs]):
            results = self._run_group(adapter, version, [reqs[i] for i in group], [kept[i] for i in group])
            for i, res in zip(group, results):
                out[i] = res
        return out

    @torch.no_grad()
    def _run_group(self, adapter: str, version: int, reqs: list[GenRequest], kept: list) -> list[list[GenResult]]:
        """Prefill what each request's kept cache lacks (in sub-batches of similar new-token
        counts: a cache miss of 600 tokens would otherwise pad every hit of 20 to 600), decode
        all rows as one batch, and keep each cacheable conversation's cache for its next call
        (prompt + answer but its last token, which never ran).  Requests with the same prompt
        and nothing kept are prefilled once (``_alike``), as one request's ``n`` samples are."""
        reserve = max(min(r.max_tokens, self.max_len - len(r.prompt_ids)) for r in reqs)
        alike = _alike(reqs, kept)
        firsts = [members[0] for members in alike]
        parts = kv_rows.partition([len(reqs[f].prompt_ids) - kept[f][1] for f in firsts], PREFILL_FIXED_TOKENS)
        prefilled = [self._prefill([reqs[firsts[j]] for j in part], [kept[firsts[j]] for j in part], reserve)
                     for part in parts]
        sources = [j for part in parts for j in part]          # prefilled rows, in the batch's order
        order = [i for j in sources for i in alike[j]]          # requests, by the row they start from
        counts = [sum(reqs[i].n for i in alike[j]) for j in sources]    # decode rows each prefilled row becomes
        reqs = [reqs[i] for i in order]
        cache, mask = kv_rows.concat([(c, m) for c, m, _ in prefilled], reserve)
        logits = torch.cat([last for *_, last in prefilled])
        cache, mask = kv_rows.repeat_rows(cache, mask, counts)
        logits = logits.repeat_interleave(torch.tensor(counts, device=logits.device), dim=0)
        rows = [(i, k) for i, r in enumerate(reqs) for k in range(r.n)]
        results, mask = self._decode(reqs, rows, cache, mask, logits, version)
        for b, (i, _) in enumerate(rows):
            if self._cacheable(reqs[i]):
                ids = reqs[i].prompt_ids + results[i][0].completion_ids[:-1]
                self.prefix_cache.put(reqs[i].cache_key, ids, kv_rows.split(cache, mask, b, len(ids)), version, adapter)
        back: list = [None] * len(reqs)
        for j, i in enumerate(order):
            back[i] = results[j]
        return back

    @torch.no_grad()
    def _share_prefixes(self, reqs: list[GenRequest], kept: list) -> list:
        """Requests with nothing kept that open with the same long prefix (a task's system
        prompt, tools and worked example, before each problem's own question) get the prefix's
        keys and values computed once, as if each had kept them: the batch then prefills only
        what differs.  Grouped by their first MIN_TOKENS ids; identical prompts are left to
        ``_alike``, which runs them once whole."""
        groups: dict[tuple, list[int]] = {}
        for i, (r, (kv, _)) in enumerate(zip(reqs, kept)):
            if kv is None and len(r.prompt_ids) > MIN_TOKENS:
                groups.setdefault(tuple(r.prompt_ids[:MIN_TOKENS]), []).append(i)
        kept = list(kept)
        for members in groups.values():
            prompts = sorted(array("i", reqs[i].prompt_ids).tobytes() for i in members)
            if prompts[0] == prompts[-1]:
                continue
            shared = min(common_prefix(prompts[0], prompts[-1]), min(len(reqs[i].prompt_ids) for i in members) - 1)
            if shared < MIN_TOKENS:
                continue
            prefix = reqs[members[0]].prompt_ids[:shared]
            out = self.model(input_ids=torch.tensor([prefix], device=self.device), use_cache=True,
                             **self._last_logits)
            row = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            for i in members:
                kept[i] = (row, shared)
        return kept

    def _prefill(self, reqs: list[GenRequest], kept: list, reserve: int):
        """Run each request's new tokens after its kept columns: (cache, mask, last logits)."""
        lengths = [n for _, n in kept]
        new = [r.prompt_ids[n:] for r, n in zip(reqs, lengths)]
        width = max(len(t) for t in new)
        cache, past = kv_rows.stack([kv for kv, _ in kept], lengths, width + reserve, self._layers)
        input_ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(reqs), width), dtype=torch.long)
        positions = torch.zeros((len(reqs), width), dtype=torch.long)
        for b, (tokens, n) in enumerate(zip(new, lengths)):
            input_ids[b, width - len(tokens):] = torch.tensor(tokens)
            new_mask[b, width - len(tokens):] = 1
            positions[b, width - len(tokens):] = torch.arange(n, n + len(tokens))
        mask = torch.cat([past.to(self.device), new_mask.to(self.device)], dim=1)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask,
                         position_ids=positions.to(self.device), use_cache=True, **{self._cache_kw: cache},
                         **self._last_logits)
        return cache, mask, out.logits[:, -1, :].float()

    def _decode(self, reqs, rows, cache, mask, logits, version):
        """Sample until every row stops: one token per step through the KV cache, written in
        place (kv_rows.ReservedLayer).  Returns the results and the mask of the cache's columns."""
        B = len(rows)
        prompts = [reqs[i].prompt_ids for i, _ in rows]
        temps = torch.tensor([reqs[i].temperature for i, _ in rows], device=self.device)
        top_ps = [reqs[i].top_p for i, _ in rows]
        limits = [min(reqs[i].max_tokens, self.max_len - len(p)) for (i, _), p in zip(rows, prompts)]
        gens = [torch.Generator(device=self.device).manual_seed(reqs[i].seed + k)
                if reqs[i].seed is not None else None for i, k in rows]
        out_ids: list[list[int]] = [[] for _ in rows]
        out_lp: list[list[float]] = [[] for _ in rows]
        tops = [reqs[i].top_logprobs for i, _ in rows]
        out_top: list[list] = [[] for _ in rows]
        k_top = max(tops)
        finish: list[str | None] = [None] * B
        eos = set(self.eos_ids)
        columns = mask.shape[1]
        static = kv_rows.StaticDecode(self.model, cache, mask, columns, B, self._cache_kw,
                                      graph=self.device.type == "cuda" and max(limits) > GRAPH_MIN_STEPS) \
            if self.static_decode and max(limits) > 1 else None
        mask = torch.cat([mask, torch.ones((B, max(limits)), dtype=mask.dtype, device=mask.device)], dim=1)
        next_pos = torch.tensor([[len(p)] for p in prompts], device=self.device)
        for _ in range(max(limits)):
            greedy = temps <= 0
            scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(-1)
            logp = torch.log_softmax(scaled, dim=-1)
            tokens = self._sample(logp, greedy, top_ps, gens)
            chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
            tok_list = tokens.tolist()
            if k_top:
                top_lp, top_ids = logp.topk(k_top, dim=-1)
                top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
            for b in range(B):
                if finish[b] is not None:
                    continue
                out_ids[b].append(tok_list[b])
                out_lp[b].append(chosen[b])
                if tops[b]:
                    out_top[b].append([[t, lp] for t, lp in zip(top_ids[b][:tops[b]], top_lp[b][:tops[b]])])
                if tok_list[b] in eos or self._hit_stop(reqs[rows[b][0]].stop, out_ids[b]):
                    finish[b] = "stop"
                elif len(out_ids[b]) >= limits[b]:
                    finish[b] = "length"
            if all(f is not None for f in finish):
                break
            columns += 1
            if static is not None:
                logits = static.step(tokens, next_pos)
            else:
                out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask[:, :columns], position_ids=next_pos,
                                 use_cache=True, **{self._cache_kw: cache})
                logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        results: list[list[GenResult]] = [[] for _ in reqs]
        for b, (i, _) in enumerate(rows):
            results[i].append(GenResult(out_ids[b], out_lp[b], finish[b] or "length", version,
                                        out_top[b] if tops[b] else None))
        return results, mask[:, :columns]

    def _sample(self, logp: torch.Tensor, greedy: torch.Tensor, top_ps: list[float],
                gens: list) -> torch.Tensor:
        """One token per row.  Rows without a seed of their own are drawn in one multinomial
        call (one call per row was ~18% of the engine's CPU on short answers); a seeded
        request keeps its own generator, so its tokens depend on its seed alone."""
        tokens = logp.argmax(-1)
        probs = logp.exp()
        sampled = [b for b, g in enumerate(greedy.tolist()) if not g]
        for b in sampled:
            if top_ps[b] < 1.0:
                p = probs[b]
                sorted_p, order = p.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < top_ps[b]
                probs[b] = torch.zeros_like(p).scatter(0, order[keep], sorted_p[keep])
        shared = [b for b in sampled if gens[b] is None]
        if shared:
            rows = torch.tensor(shared, device=logp.device)
            tokens[rows] = torch.multinomial(probs[rows], 1, generator=self.generator).squeeze(-1)
        for b in sampled:
            if gens[b] is not None:
                tokens[b] = torch.multinomial(probs[b], 1, generator=gens[b])[0]
        return tokens

    def _hit_stop(self, stop: list[str], ids: list[int]) -> bool:
        if not stop:
            return False
        tail = self.tokenizer.decode(ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)


def _alike(reqs: list[GenRequest], kept: list) -> list[list[int]]:
    """Indices of ``reqs`` grouped by the prefill they can share: requests with the same prompt
    ids that start from the same place — nothing kept, or one prefix shared by
    ``_share_prefixes`` (a GRPO group's members ask the same first question, rendered the same
    way) — run their prompt once; a conversation's own kept cache is never shared.  In
    first-seen order."""
    uses = Counter(id(kv) for kv, _ in kept if kv is not None)
    groups: dict = {}
    for i, (r, (kv, _)) in enumerate(zip(reqs, kept)):
        # a cache only this request starts from is a conversation's own: alone, its prompt unhashed
        key = i if kv is not None and uses[id(kv)] == 1 else (id(kv), tuple(r.prompt_ids))
        groups.setdefault(key, []).append(i)
    return list(groups.values())
