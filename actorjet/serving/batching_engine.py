"""What every inference engine shares: requests, results, and dynamic batching in one thread.

Requests that arrive close together are generated together; new weights are applied between
batches, never inside one, and every result says which weight version produced it.  The
transformers engine (serving/transformers_engine.py) and the vLLM engine (serving/vllm_engine.py) implement
``_generate(reqs)`` and ``_load(path, adapter)``.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from actorjet.runtime import guarded
from actorjet.runtime.logs import log
from actorjet.serving import weights


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
        self.phases = {"requests": 0, "collect_s": 0.0, "generate_s": 0.0, "load_s": 0.0}   # the engine's own time
        self.served: list[dict] = []     # weight versions applied, not yet reported (the step timeline)
        self.last_success = 0.0          # monotonic time of the last batch that worked
        self.isolated = 0                # requests that failed alone (RequestFailed)
        self._thread = None
        if start_thread:       # a batcher that dies takes the engine actor with it (restarted)
            self._thread = guarded.start(self._loop, "engine-batcher", crash_process=crash_on_thread_death)

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

    def close(self, wait_s: float = 5.0) -> None:
        """Stop taking requests and let the batcher finish its batch (at most ``wait_s``): a
        batcher still inside torch when the interpreter exits aborts the process ("terminate
        called without an active exception")."""
        self._closed = True
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

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
            collecting = time.perf_counter()
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
                started = time.perf_counter()
                self.phases["collect_s"] += started - collecting
                try:
                    results = self._generate([r for r, _ in batch])
                    self.last_success = time.monotonic()
                    self.phases["generate_s"] += time.perf_counter() - started
                    self.phases["requests"] += len(batch)
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
        started = time.perf_counter()
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
        load_s = time.perf_counter() - started
        self.phases["load_s"] += load_s
        self.served.append({"adapter": adapter, "weight_version": version, "served": time.time(),
                            "load_s": round(load_s, 4)})
        del self.served[:-100]          # an engine no actor reports for keeps only the latest

    def _generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        raise NotImplementedError

    def _load(self, path: str, adapter: str = "") -> None:
        raise NotImplementedError
