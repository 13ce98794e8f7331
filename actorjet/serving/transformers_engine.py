"""The transformers inference engine: batched sampling that returns token ids and logprobs.

Why a hand-written sampling loop instead of ``model.generate``: every request in a batch
may have its own temperature, top_p, length, stop strings and seed, and training needs
the exact log-probability of every sampled token.  The loop is short: left-pad the
prompts, run the prompt once, then one token per step with the KV cache.

Requests that arrive close together are generated together (serving/batching_engine.py);
a long conversation's call runs alone with its kept KV cache (serving/prefix_cache.py).

Logprobs are taken under softmax(logits / temperature) — the distribution that was
sampled, before top_p truncation — so the learner can recompute them exactly; greedy
requests (temperature 0) record logprobs at temperature 1.
"""
from __future__ import annotations

import inspect
import time
from pathlib import Path

import torch

from actorjet.runtime.logs import log
from actorjet.serving import weights
from actorjet.serving.batching_engine import BatchingEngine, GenRequest, GenResult  # noqa: F401 - what engines return
from actorjet.serving.prefix_cache import MIN_TOKENS, PrefixCache


class TransformersEngine(BatchingEngine):
    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu", dtype: str = "float32",
                 max_batch: int = 64, window_s: float = 0.004, seed: int = 0,
                 model=None, tokenizer=None, start_thread: bool = True, crash_on_thread_death: bool = False,
                 lora: dict | None = None, adapters: dict[str, dict] | None = None, prefix_cache_mb: float = 1024):
        """Load ``model_dir``, or wrap an already loaded ``model``/``tokenizer`` (the learner
        evaluates its own weights this way, with ``start_thread=False``).  ``lora``: serve the
        base with an adapter (rl/lora.py); published versions are then adapters.
        ``adapters``: more adapters over the same base, by name (their lora tables): the
        models of the job that share this one's base.  ``prefix_cache_mb``: memory for the KV
        caches of conversations between their calls (serving/prefix_cache.py; 0: none)."""
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
        self.prefix_cache = PrefixCache(prefix_cache_mb)
        self._start_batching(max_batch, window_s, start_thread, crash_on_thread_death=crash_on_thread_death)
        self.versions.update(dict.fromkeys(adapters or {}, 0))

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
        """Long conversations one by one with their kept KV cache; the rest as one batch."""
        if self.peft is not None and len(self.peft.peft_config) > 1:
            from actorjet.rl.lora import ADAPTER
            self.peft.set_adapter(adapter or ADAPTER)
        self.batches += 1
        for r in reqs:                   # the gateway hands over its int32 array: listed here, off its loop
            if not isinstance(r.prompt_ids, list):
                r.prompt_ids = list(r.prompt_ids)
        out: list = [None] * len(reqs)
        rest = [i for i, r in enumerate(reqs) if not self._cacheable(r)]
        for i, req in enumerate(reqs):
            if i not in rest:
                out[i] = self._generate_cached(adapter, req)
        if rest:
            for i, res in zip(rest, self._generate_batch(adapter, [reqs[i] for i in rest])):
                out[i] = res
        return out

    @torch.no_grad()
    def _generate_cached(self, adapter: str, req: GenRequest) -> list[GenResult]:
        """One conversation's call: prefill only what its kept cache does not hold, sample,
        and keep the cache (prompt + answer but its last token) for its next call."""
        from transformers import DynamicCache

        version = self.versions[adapter]
        kv, n = self.prefix_cache.take(req.cache_key, req.prompt_ids, version, adapter)
        kv = kv if kv is not None else DynamicCache()
        new = torch.tensor([req.prompt_ids[n:]], device=self.device)
        positions = torch.arange(n, len(req.prompt_ids), device=self.device).unsqueeze(0)
        out = self.model(input_ids=new, position_ids=positions, use_cache=True, **{self._cache_kw: kv},
                         **self._last_logits)
        results, kv = self._decode([req], [(0, 0)], out.past_key_values, out.logits[:, -1, :].float(),
                                   positions[:, -1:] + 1, None, version)
        ids = list(req.prompt_ids) + results[0][0].completion_ids[:-1]
        self.prefix_cache.put(req.cache_key, ids, kv, version, adapter)
        return results[0]

    @torch.no_grad()
    def _generate_batch(self, adapter: str, reqs: list[GenRequest]) -> list[list[GenResult]]:
        version = self.versions[adapter]
        rows = [(i, k) for i, r in enumerate(reqs) for k in range(r.n)]
        prompts = [reqs[i].prompt_ids for i, _ in rows]
        width = max(len(p) for p in prompts)
        B = len(rows)
        input_ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, width), dtype=torch.long)
        for b, p in enumerate(prompts):
            input_ids[b, width - len(p):] = torch.tensor(p)
            mask[b, width - len(p):] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **self._last_logits)
        return self._decode(reqs, rows, out.past_key_values, out.logits[:, -1, :].float(), positions[:, -1:] + 1,
                            mask, version)[0]

    def _decode(self, reqs, rows, past, logits, next_pos, mask, version):
        """Sample until every row stops: one token per step through the KV cache.  ``mask``:
        the left-padded batch's attention mask (None: one row, no padding)."""
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
            if mask is not None:
                mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=self.device)], dim=1)
            out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=next_pos,
                             use_cache=True, **{self._cache_kw: past})
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        results: list[list[GenResult]] = [[] for _ in reqs]
        for b, (i, _) in enumerate(rows):
            results[i].append(GenResult(out_ids[b], out_lp[b], finish[b] or "length", version,
                                        out_top[b] if tops[b] else None))
        return results, past

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
