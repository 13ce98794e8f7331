"""The engine actor: one inference engine per model (or replica), and its two endpoints.

It builds the engine, starts the endpoints serving/engine_wire.py defines (``/generate`` for
its gateway, the weights receiver for a learner on another node), announces them, and
supervises: weights arrive as ``LoadWeights`` control messages and are applied between
batches, so no request is ever dropped by a weight update; progress, hardware and the weight
versions it began to serve go to the registry.
"""
from __future__ import annotations

from datetime import timedelta

from thespian.actors import WakeupMessage

from actorjet.models.prepare import model_config_here, preload_libraries
from actorjet.config import sharing
from actorjet.serving.engine_wire import Receiver, engine_app
from actorjet.serving.serve import AppServer
from actorjet.runtime import endpoints, guarded
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor

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
        self.receiver = Receiver(endpoints.local_run_dir(self.context) / "weights-received",
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
