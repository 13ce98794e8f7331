"""The engine actor: one inference engine per model, served on an internal HTTP endpoint.

Token ids in, token ids and logprobs out (``POST /generate``, a list of requests per call:
the gateway sends every request that arrived in one turn of its event loop together, so
HTTP and JSON are paid per batch rather than per LLM call).  The gateway is its only
client; weights arrive as ``LoadWeights`` control messages and are applied between
batches, so no request is ever dropped by a weight update.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import threading
from array import array
from datetime import timedelta

from aiohttp import web
from thespian.actors import WakeupMessage

from actorjet.models.prepare import model_config_here, preload_libraries
from actorjet.config import sharing
from actorjet.serving.batching_engine import GenRequest, RequestFailed
from actorjet.serving import weights
from actorjet.serving.serve import AppServer
from actorjet.runtime import endpoints, guarded
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.signing import bearer_ok

preload = preload_libraries      # runtime/kinds.py: what a head imports once, before forking this actor


PROGRESS_S = 1.0
SERVED = "served"          # the wakeup that reports weight versions the batcher began to serve
SERVED_POLL_S = 0.05
SERVED_POLLS = 200         # then the slow progress wakeup reports it (a batch of minutes on a big model)


def make_engine(cfg: dict, seed: int, adapters: dict[str, dict] | None = None):
    """The engine a model config asks for; vLLM is imported only when asked for.
    ``adapters``: the models that share this one's base (job.sharing)."""
    if cfg["engine"] == "vllm":
        from actorjet.serving.vllm_engine import VLLMEngine
        return VLLMEngine(cfg["path"], dtype="bfloat16" if cfg["dtype"] == "float32" else cfg["dtype"],
                          seed=seed, max_batch=cfg["max_batch"], crash_on_thread_death=True, lora=cfg.get("lora"),
                           tensor_parallel_size=cfg.get("tensor_parallel_size", 1))
    from actorjet.runtime import gpu_memory, gpus
    from actorjet.serving.transformers_engine import TransformersEngine
    return TransformersEngine(cfg["path"], device=cfg["device"], dtype=cfg["dtype"],
                              max_batch=cfg["max_batch"], seed=seed, crash_on_thread_death=True, lora=cfg.get("lora"),
                              adapters=adapters, prefix_cache_mb=cfg.get("prefix_cache_mb", -1.0),
                              gpu_share=gpu_memory.engine_share(cfg, gpus.gpu_count()), name=cfg.get("name", ""))


def all_done(futures: list) -> asyncio.Future:
    """An awaitable that resolves once every one of the engine's futures is done.  Waking the
    event loop once per call rather than once per request (asyncio.wrap_future does the
    latter, each through the loop's self-pipe) was a quarter of the engine's HTTP-side CPU."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = [len(futures)]
    lock = threading.Lock()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def one_done(_future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last and not loop.is_closed():
            loop.call_soon_threadsafe(finish)

    if not futures:
        finish()
    for future in futures:
        future.add_done_callback(one_done)
    return done


def read_request(body: dict) -> GenRequest:
    """serving/engine_client.py's wire_request undone: the prompt comes as base64 of int32."""
    ids = body.pop("prompt_ids")
    if isinstance(ids, str):
        raw = base64.b64decode(ids, validate=True)
        if len(raw) % 4:
            raise ValueError("prompt_ids: not whole int32 values")
        ids = array("i", raw).tolist()
    if not isinstance(body.get("cache_key", ""), str):
        raise ValueError("cache_key: a string")
    return GenRequest(prompt_ids=ids, **body)


def engine_app(engine, token: str | None = None) -> web.Application:
    """``token``: the cluster token every caller must send (the endpoint listens on the node's
    network address); None only for in-process tests."""
    async def generate(request):
        if token is not None and not bearer_ok(request.headers.get("Authorization"), token):
            return web.json_response({"error": {"message": "the engine needs the cluster token"}}, status=401)
        try:
            body = json.loads(await request.read())
            reqs = [read_request(r) for r in body["requests"]]
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, binascii.Error) as e:
            return web.json_response({"error": {"message": f"malformed generate request: {e}"}}, status=400)
        futures = [engine.submit(r) for r in reqs]
        await all_done(futures)
        answers = []
        for outcome in [f.exception() or f.result() for f in futures]:
            if isinstance(outcome, RequestFailed):      # this request's own fault: a 400 at the gateway
                answers.append({"error": str(outcome), "request_error": True})
            elif isinstance(outcome, BaseException):
                answers.append({"error": f"{type(outcome).__name__}: {outcome}"})
            else:
                answers.append({"results": [r.__dict__ for r in outcome]})
        return web.json_response({"answers": answers})

    async def health(request):
        return web.json_response({"ok": True, "weight_version": engine.weight_version, "versions": engine.versions})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/generate", generate)
    app.router.add_get("/healthz", health)
    return app


class Engine(ManagedActor):
    def on_init(self) -> None:
        job = self.context["job"]
        self.model = self.args["model"]
        cfg = model_config_here(job, self.model, claim_gpu=True)
        self.engine = make_engine(cfg, job["train"]["seed"], sharing(job, self.model))
        if cfg["engine"] == "transformers":
            from actorjet.serving import threads
            threads.configure(cfg["threads"], cfg["device"], self.engine.model.num_parameters())

        # versions pushed by a learner on another node (serving/weights.py), on a port of their own
        self.receiver = weights.Receiver(endpoints.local_run_dir(self.context) / "weights-received",
                                         self.context["token"], endpoints.bind_host())
        guarded.start(self.receiver.serve_forever, f"weights-receiver.{self.model}", crash_process=True)
        self.wakeupAfter(timedelta(seconds=PROGRESS_S))
        replica = int(self.args.get("replica", 0))      # engines = N: replica K announces engine.K (K > 0)
        self.kind = "engine" + (f".{replica}" if replica else "")
        # its name keeps its port across restarts (runtime/endpoints.py): one name per replica
        self.server = AppServer(engine_app(self.engine, self.context["token"]), name=f"{self.kind}.{self.model}")
        self.announce(self.model, {self.kind: self.server.url,
                                   self.kind.replace("engine", "weights"): endpoints.url(self.receiver.port)})

    def receiveMsg_Crash(self, msg: m.Crash, sender):
        if msg.thread:
            self.engine.crash_thread(msg.error)
        else:
            super().receiveMsg_Crash(msg, sender)

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        """Progress for the registry's watchdog: batches done, requests waiting.  A ``served``
        wakeup follows a LoadWeights until the batcher applied it (the step timeline)."""
        if msg.payload == SERVED:
            self._report_served()
            adapter, version, polls = self.announced
            if self.engine.versions.get(adapter, 0) < version and polls < SERVED_POLLS:    # not applied yet
                self.announced = (adapter, version, polls + 1)
                self.wakeupAfter(timedelta(seconds=SERVED_POLL_S), payload=SERVED)
            return
        if self.registry is not None:
            self.send(self.registry, proto.Progress(self.model, self.kind, self.engine.batches, self.engine.waiting()))
            self.send(self.registry, proto.Hardware(self.model, self.kind, self.hardware()))
            self._report_served()
        self.wakeupAfter(timedelta(seconds=PROGRESS_S))

    def _report_served(self) -> None:
        """A ``kind = "served"`` metrics line per weight version this replica began to serve
        (the step timeline's last stage, monitor/timeline.py), with the engine's own phases
        so far: time collecting batches, generating, loading weights."""
        while self.engine.served:         # the batcher appends: pop, never swap the list
            s = self.engine.served.pop(0)
            if self.registry is None:
                continue
            self.send(self.registry, m.Metric({
                "kind": "served", "model": s["adapter"] or self.model, "replica": self.kind,
                "weight_version": s["weight_version"], "time": s["served"], "load_s": s["load_s"],
                "engine": {"batches": self.engine.batches, **{k: round(v, 4) for k, v in self.engine.phases.items()}}}))

    def receiveMsg_Stall(self, msg: proto.Stall, sender):
        self.engine.stall_thread(msg.seconds)

    def receiveMsg_LoadWeights(self, msg: proto.LoadWeights, sender):
        self.engine.load_weights(msg.version, msg.path, msg.adapter)
        self.announced = (msg.adapter, msg.version, 0)
        self.wakeupAfter(timedelta(seconds=SERVED_POLL_S), payload=SERVED)

    def on_stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop(self.stop_grace_s)
            self.engine.close()
        if getattr(self, "receiver", None):
            self.receiver.stop()

    def hardware(self) -> dict:
        cache = getattr(self.engine, "prefix_cache", None)       # the vLLM engine keeps its own
        return {"device": str(getattr(self.engine, "device", "cuda")),
                **({"kv_budget_mb": round(cache.budget / 2 ** 20, 1), "kv_used_mb": round(cache.used / 2 ** 20, 1),
                    "kv_kept": len(cache.entries)} if cache is not None else {})}

    def info(self) -> dict:
        return {"path": self.path, "model": getattr(self, "model", None),
                "weight_version": getattr(getattr(self, "engine", None), "weight_version", None)}
