"""The transformers inference engine: batched sampling that returns token ids and logprobs.

Why a hand-written sampling loop instead of ``model.generate``: every request in a batch
may have its own temperature, top_p, length, stop strings and seed, and training needs
the exact log-probability of every sampled token.  The loop is short: left-pad the
prompts, run the prompt once, then one token per step with the KV cache.

Requests that arrive close together are generated together (dynamic batching, below).  New weights are applied between batches, never inside one,
and every result says which weight version produced it.

Logprobs are taken under softmax(logits / temperature) — the distribution that was
sampled, before top_p truncation — so the learner can recompute them exactly; greedy
requests (temperature 0) record logprobs at temperature 1.
"""
from __future__ import annotations

import inspect
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from actorjet.runtime import guarded
from actorjet.runtime.logs import log
from actorjet.serving import weights
from actorjet.serving.prefix_cache import MIN_TOKENS, PrefixCache


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    top_logprobs: int = 0        # alternatives per sampled token (OpenAI's top_logprobs)
    adapter: str = ""            # which LoRA adapter serves it: "" = the engine's own model's
    cache_key: str = ""          # its conversation (episode/role): the engine may keep its KV cache


class RequestFailed(Exception):
    """This request failed on its own while the engine works (its batch-mates succeeded, or
    the engine served others lately): the request's fault, answered with a 400, never retried."""


@dataclass
class GenResult:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str          # "stop" (eos or stop string) | "length"
    weight_version: int
    top_logprobs: list | None = None   # per token: [[token id, logprob], ...] when asked for


class BatchingEngine:
    """Requests that arrive within ``window_s`` of each other (for at most ``max_wait_s``)
    are generated together, up to ``max_batch`` sequences, in one background thread;
    weights change only between batches.  Under load (the last batch held more than one
    request) the window is ``busy_window_s``: on a CPU shared with the agents, requests arrive
    spread out, and a short window cut batches at ~38 requests when 128 were in flight; a
    batch costs ~40% less per request at 128 than at 32 (tiny-arith, 4 tokens).
    Subclasses implement ``_generate(reqs)`` and ``_load(path, adapter)``.

    Weight versions are per adapter: "" is the engine's own model; a model that shares this
    engine's base (``base = ...`` in the job config) is served as an adapter named after it,
    with versions from its own learner."""

    def _start_batching(self, max_batch: int, window_s: float, start_thread: bool,
                        max_wait_s: float = 0.1, crash_on_thread_death: bool = False,
                        busy_window_s: float = 0.02) -> None:
        self.max_batch, self.window_s, self.max_wait_s = max_batch, window_s, max_wait_s
        self.busy_window_s = max(window_s, busy_window_s)
        self._last_requests = 0
        self.versions: dict[str, int] = {"": 0}
        self._pending_weights: dict[str, tuple[int, str]] = {}
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._unanswered = 0
        self._closed = False
        self.batches = 0
        self.last_success = 0.0          # monotonic time of the last batch that worked
        self.isolated = 0                # requests that failed alone (RequestFailed)
        if start_thread:       # a batcher that dies takes the engine actor with it (restarted)
            guarded.start(self._loop, "engine-batcher", crash_process=crash_on_thread_death)

    # -- public -------------------------------------------------------------------------
    def submit(self, req: GenRequest) -> Future:
        """Queue a request; the future resolves to ``n`` GenResults."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("engine is closed"))
        else:
            with self._count_lock:
                self._unanswered += 1
            fut.add_done_callback(self._answered)
            self._queue.put((req, fut))
        return fut

    def _answered(self, _fut: Future) -> None:
        with self._count_lock:
            self._unanswered -= 1

    def generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        """Synchronous, in the caller's thread (used by evaluation and benchmarks)."""
        with self._lock:
            return self._generate(reqs)

    @property
    def weight_version(self) -> int:
        """The version the engine's own model is served at."""
        return self.versions[""]

    def load_weights(self, version: int, path: str, adapter: str = "") -> None:
        """Use the weights in ``path`` (safetensors) from the next batch on."""
        self._pending_weights[adapter] = (version, path)
        self._queue.put(None)      # wake the batcher even when idle

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)

    def stall_thread(self, seconds: float) -> None:
        """Test hook: the batcher thread sleeps ``seconds`` at its next turn (a hang)."""
        self._queue.put(("stall", seconds))

    def waiting(self) -> int:
        """Requests taken and not yet answered: queued, or held in a batch being collected or
        generated (a batcher stuck while holding every request in flight has work waiting,
        though its queue is empty: the watchdog must see it)."""
        return self._unanswered

    def crash_thread(self, error: str) -> None:
        """Test hook: the batcher thread raises ``error`` at its next turn."""
        self._queue.put(RuntimeError(error))

    # -- batching thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            item = self._queue.get()
            if self._test_hook(item):
                continue
            batch = [item] if item is not None else []
            # Dynamic batching: keep collecting while requests keep coming (each within
            # window_s of the last), for at most max_wait_s: a burst from many agents lands
            # in one batch instead of a small first batch and a long queue behind it.
            cap = time.monotonic() + self.max_wait_s
            size = sum(r.n for r, _ in batch)
            window = self.busy_window_s if self._last_requests > 1 else self.window_s
            while size < self.max_batch:
                timeout = min(window, cap - time.monotonic())
                try:
                    item = self._queue.get(timeout=max(0.0, timeout))
                except queue.Empty:
                    break
                if item is not None and not self._test_hook(item):
                    batch.append(item)
                    size += item[0].n
            self._last_requests = len(batch)     # requests, not sequences: a lone caller's n=8 is not load
            with self._lock:
                self._apply_weights()
                if not batch:
                    continue
                try:
                    results = self._generate([r for r, _ in batch])
                    self.last_success = time.monotonic()
                except Exception as e:  # noqa: BLE001 - a bad batch fails its requests, not the engine
                    self._isolate(batch, e)
                    continue
            for (_, fut), res in zip(batch, results):
                fut.set_result(res)

    def _isolate(self, batch: list, error: Exception, healthy_s: float = 60.0) -> None:
        """A batch failed: run each request alone, so one bad request costs only itself.
        A request that fails alone is its own fault when the others worked (or the engine
        served a batch within ``healthy_s``): RequestFailed.  If every one fails and the engine
        has not worked lately, the engine is at fault: the original error, retryable."""
        outcomes = []
        for req, fut in batch:
            try:
                outcomes.append((fut, self._generate([req])[0], None))
                self.last_success = time.monotonic()
            except Exception as e:  # noqa: BLE001 - judged below
                outcomes.append((fut, None, e))
        engine_works = any(e is None for _, _, e in outcomes) or \
            time.monotonic() - self.last_success < healthy_s and self.last_success > 0
        for fut, result, e in outcomes:
            if e is None:
                fut.set_result(result)
            elif engine_works:
                self.isolated += 1
                fut.set_exception(RequestFailed(f"{type(e).__name__}: {e}"))
            else:
                fut.set_exception(error)

    @staticmethod
    def _test_hook(item) -> bool:
        """crash_thread / stall_thread markers in the queue: raise, or sleep (True: handled)."""
        if isinstance(item, Exception):
            raise item
        if isinstance(item, tuple) and item and item[0] == "stall":
            time.sleep(item[1])
            return True
        return False

    def _apply_weights(self) -> None:
        """Load the newest announced weights of every adapter."""
        while self._pending_weights:
            adapter, (version, path) = self._pending_weights.popitem()
            self._apply(adapter, version, path)

    def _apply(self, adapter: str, version: int, path: str) -> None:
        """A file that is gone already (a restarted learner cleaned up, or published newer
        ones meanwhile) is a logged, recovered event: the newest version in the same directory
        is loaded instead (learner and engine of a model share a node), and if there is none
        the current weights stay.  A torn read (the file was recycled while read:
        serving/weights.py) left a mix, so the newest is loaded whatever its number."""
        try:
            self._load(path, adapter)
        except (FileNotFoundError, weights.TornRead) as e:
            torn = isinstance(e, weights.TornRead)
            newest = weights.newest(Path(path).parent)
            log.warning("engine: weights %s %s; %s", path, "were recycled while read" if torn else "are gone",
                        f"loading {newest.name} instead" if newest else "keeping version %d" % self.versions[adapter])
            if newest is None:
                if torn:
                    raise RuntimeError(f"weights {path} were torn and no whole version is left") from e
                return
            path, version = str(newest), int(newest.stem[1:])
            if version <= self.versions[adapter] and not torn:
                return
            self._load(path, adapter)
        self.versions[adapter] = version

    def _generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        raise NotImplementedError

    def _load(self, path: str, adapter: str = "") -> None:
        raise NotImplementedError


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
        out = self.model(input_ids=new, position_ids=positions, use_cache=True, **{self._cache_kw: kv})
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
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
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
