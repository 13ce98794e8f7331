"""The learner actor: one per trainable model.  It pulls batches from its model's episode
store and turns them into weight versions.

Loop, top to bottom:  a prefetch thread claims the next batch's groups from the store
(``next_batch``: task quotas, credit, packing — rl/batching.py) while the current step
trains → drop sampled tokens staler than ``max_staleness`` versions → one step of the model's
algorithm (rl/grpo.py, rl/algorithms.py) → mark the groups trained → publish weights as
version v+1 (serving/weights.py; the adapter alone with LoRA) → tell the engines (LoadWeights)
and the registry (Trained, metrics, counts) → every ``eval_every`` steps a held-out
evaluation (in a thread), every ``checkpoint_every`` steps a checkpoint.  On a full disk a
step's writes wait (actorjet/disk.py).  The store, the weights and the checkpoints are on the
learner's own node; nothing here reads a file of the head's.  A (re)started learner rewinds
the store to its checkpoint and simply pulls again.  A frozen model gets no learner.
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch

from actorjet.config import engine_of
from actorjet.serving.engine_client import replica_addresses
from actorjet.models import repairs
from actorjet.models.evaluations import Evaluations
from actorjet.models.heldout import eval_spec
from actorjet.models.trainee import Trainee
from actorjet.models.prepare import model_config_here, preload_libraries
from actorjet.store import episode_store
from actorjet.store.quarantine_queue import QuarantineQueue
from actorjet.serving import engine_wire, threads, weights
from actorjet.rl import algorithms, ranks
from actorjet.rl.batching import batch_config, next_batch
from actorjet.rl.grpo import BadBatch, grpo_step
from actorjet.rl.step import StepTimes, keep_fresh, step_record, timeline_record
from actorjet import disk
from actorjet.runtime import endpoints, gpu_memory, gpus, guarded
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.actors.learner_rank import lead
from actorjet.runtime.logs import log

preload = preload_libraries      # runtime/kinds.py: what a head imports once, before forking this actor

POLL_S = 0.02        # how often the actor looks for a prefetched batch
FINISHED_POLL_S = 1.0    # ... once its steps are done and no evaluation runs: an idle head stays idle
IDLE_S = 0.05        # the prefetch thread's pause when no batch is ready in the store
QUIET_AFTER_S = 10.0     # no batch and no recorded call for this long: the swarm is idle ...
QUIET_POLL_S = 0.25      # ... and both loops look this often (Learner._pause)


class Learner(ManagedActor):
    def on_init(self) -> None:
        from transformers import AutoTokenizer

        job = self.context["job"]
        self.model_name = self.args["model"]
        self.cfg = model_config_here(job, self.model_name, claim_gpu=True)
        self.train_cfg = job["train"]
        self.run_dir = endpoints.local_run_dir(self.context)      # this node's: weights, checkpoints
        torch.manual_seed(self.train_cfg["seed"])
        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg["path"])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.gpu_share = gpu_memory.limit_learner(self.cfg, self.cfg["device"], gpus.gpu_count())
        self.algo = algorithms.from_config(self.cfg)      # GRPO, PPO, …, and its knobs (rl/algorithms.py)
        # the model, its optimizer and critic: from the newest checkpoint, if there is one
        self.trainee = Trainee(self.cfg, self.algo, self.run_dir / "checkpoints" / self.model_name)
        model = self.trainee.model
        gpu_memory.check_learner_fits(self.cfg, self.cfg["device"], model, self.gpu_share)
        threads.configure(self.cfg["threads"], self.cfg["device"], model.num_parameters())
        self.step = self.version = self.published_bytes = 0
        self.weights_dir = self.run_dir / "weights" / self.model_name
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.engines: dict[str, tuple] = {}      # replica → (engine address, weights receiver URL or None)
        self.engine_of = engine_of(job, self.model_name)      # its own, or its base's (base = ...)
        self.adapter = self.model_name if self.cfg.get("base") else ""
        self.finishing: dict | None = None     # a step (or a resumed version) whose writes wait for space
        # why it cannot write, by what waits (actorjet/disk.py)
        self.disk_causes = {"step": "", "prefetch": "", "rewind": "", "quarantine": ""}
        self.disk_reported = ""
        self._resume()
        world = int(self.args.get("world", 1))
        self.leader = None
        if world > 1:
            self.leader = ranks.Leader(world, endpoints.advertise_host(), timeout_s=120.0)
        self.store = None        # opened (a write: its schema, its journal) and rewound by _rewind
        repair = repairs.for_model(self.tokenizer, self.cfg)
        self.batching = batch_config(self.model_name, self.cfg, self.train_cfg, repair)
        split = self.cfg["eval_split"]
        specs = [(t["name"], spec) for t in job["tasks"] if (spec := eval_spec(t["source"], self.model_name, split))]
        self.evals = Evaluations(self.model_name, specs, self.tokenizer, self.cfg)
        if self.cfg["eval_at_start"]:
            self._evaluate()      # step 0 (or the resumed checkpoint): the starting weights' score
        services = {"learner": None, **({"ranks": self.leader.url} if self.leader else {})}
        self.announce(self.model_name, services, subscribe=True)
        if self.registry is not None:
            hardware = {"device": self.cfg["device"], "gpu_share": self.gpu_share}
            self.send(self.registry, proto.Hardware(self.model_name, "learner", hardware))
        self.rewound = threading.Event()       # the store rewound to this step: only then are batches pulled
        self._rewind()
        self._send_counts()
        if self.step >= self.train_cfg["steps"]:     # a finished run started again: it stays finished
            self.send(self.registry, proto.Trained(self.model_name, self.step, self.version, 0, done=True))
        self.ready: queue.Queue = queue.Queue(maxsize=1)     # the prefetched batch
        self.pulled = self.step            # batches taken (trained, training or prefetched)
        self.pulled_lock = threading.Lock()     # the prefetcher counts up, the actor counts down
        self.directory = threading.Event()      # task weights known: only then are batches mixed
        self.stopping = threading.Event()
        self.batch_at = time.monotonic()        # when the prefetcher last built a batch
        self.prefetcher = guarded.start(self._prefetch, f"prefetch.{self.model_name}")
        self.wakeupAfter(timedelta(seconds=POLL_S))

    def _pause(self, busy_s: float) -> float:
        """How long a loop that found no batch waits: ``busy_s`` while the swarm works, and
        QUIET_POLL_S once neither a batch nor a recorded call came for QUIET_AFTER_S (a head
        with no job yet, no runners).  An idle head's learner used 5% of a core looking for
        batches 70 times a second.  A swarm at work is never slowed: every call a gateway
        records writes the store's file (its WAL), and a write within QUIET_AFTER_S keeps the
        fast pace; the first batch after a quiet spell waits at most QUIET_POLL_S twice."""
        if time.monotonic() - self.batch_at < QUIET_AFTER_S:
            return busy_s
        written = 0.0
        for path in (self.store.path, f"{self.store.path}-wal") if self.store is not None else ():
            with contextlib.suppress(OSError):
                written = max(written, os.stat(path).st_mtime)
        return busy_s if time.time() - written < QUIET_AFTER_S else QUIET_POLL_S

    def _rewind(self) -> bool:
        """Open the store, make what was taken or trained after this step pending again: writes,
        so on a full disk they wait (nothing is pulled meanwhile) instead of crash-looping."""
        path = episode_store.path_for(self.run_dir, self.model_name)
        try:
            if self.store is None:
                self.store = episode_store.EpisodeStore(path)
                self.to_quarantine = QuarantineQueue(self.store)
            pending = self.store.rewind(self.step)
        except Exception as e:
            if not disk.is_full(e):
                raise
            cause = disk.describe(e, path)
            self.disk_causes["rewind"] = f"cannot open and rewind the store at step {self.step}: {cause}"
            return False
        self.disk_causes["rewind"] = ""
        if pending:
            log.info("%s resumes at step %d: %d groups taken or trained after it are pending again",
                     self.model_name, self.step, pending)
        if self.resumed:      # status says what a restart (a crash, a power cut) recovered
            self.send(self.registry, proto.Resumed(self.model_name, self.step, self.version, pending))
        self.rewound.set()
        return True

    def _publish(self) -> Path:
        """Weight version ``self.version``, whole or not at all (serving/weights.py)."""
        tensors = self.trainee.version_tensors()
        path, self.published_bytes = weights.publish_version(self.weights_dir, self.version, tensors)
        return path

    def _deliver(self, path: Path, replicas: list[str] | None = None) -> float | None:
        """Tell every engine replica (or those named) about version ``self.version``, pushing
        the file first to one on another node (serving/engine_wire.py ``deliver``); returns the
        seconds the pushes took (None: nothing pushed)."""
        names = self.engines if replicas is None else replicas
        engines = {n: self.engines[n] for n in names if n in self.engines}
        targets, pushed_s = engine_wire.deliver(engines, path, self.version, self.context["token"],
                                                self.adapter or self.model_name, self.model_name)
        for address, target in targets:
            self.send(address, proto.LoadWeights(self.version, target, self.adapter))
        return pushed_s

    def _resume(self) -> None:
        """After a crash (learner or head): continue from the last checkpoint (the model was
        built from it: models/trainee.py).  Groups trained after it were lost with the
        weights that saw them, so the episode store makes them pending again; the resumed
        weights are published under a new version, newer than anything the engine may still
        serve."""
        published = weights.published_versions(self.weights_dir)
        self.resumed = self.trainee.resumed_step is not None or bool(published)
        if self.trainee.resumed_step is not None:
            self.step = self.trainee.resumed_step
        if self.resumed:
            self.version = max([self.version] + published) + 1
            self.finishing = {"stage": "publish"}        # no batch: only the version to publish
            self._finish_step()
            log.info("%s resumed at step %d as weight version %d", self.model_name, self.step, self.version)

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        active = {t: v for t, v in msg.tasks.items() if v.get("state") == "active"}
        self.batching.weights = {t: v["weight"] for t, v in active.items()}
        self.directory.set()
        before, self.engines = self.engines, replica_addresses(msg.services.get(self.engine_of, {}))
        new = [name for name, (address, _) in self.engines.items() if before.get(name, (None,))[0] != address]
        if new and self.version > 0:
            # a new (or restarted) replica: make sure it serves what this learner holds
            self._deliver(self.weights_dir / f"v{self.version:06d}.safetensors", new)

    # -- the pull ----------------------------------------------------------------------------
    def _prefetch(self) -> None:
        """Claim and pack the next batch while the actor trains the current one (a thread:
        packing overlaps the optimizer step).  A failure no group explains kills the thread,
        and with it this actor's process (runtime/guarded.py): its supervisor restarts the
        learner, which rewinds the store and pulls again."""
        self.directory.wait()
        while not self.rewound.wait(IDLE_S):
            if self.stopping.is_set():
                return
        while not self.stopping.is_set():
            with self.pulled_lock:
                enough = self.pulled >= self.train_cfg["steps"]
            if enough:
                self.stopping.wait(IDLE_S)
                continue
            try:
                batch = next_batch(self.store, self.batching)
                self.disk_causes["prefetch"] = ""
            except Exception as e:     # claiming groups is a write: a full disk waits, never kills
                if not disk.is_full(e):
                    raise
                self.disk_causes["prefetch"] = f"cannot claim groups: {disk.describe(e, self.store.path)}"
                self.stopping.wait(disk.RETRY_S)
                continue
            if batch is None:
                self.stopping.wait(self._pause(IDLE_S))
                continue
            self.batch_at = time.monotonic()
            if batch["samples"] is not None:
                with self.pulled_lock:
                    self.pulled += 1
            while not self.stopping.is_set():
                try:
                    self.ready.put(batch, timeout=0.2)
                    break
                except queue.Full:
                    pass

    def _join_ranks(self) -> bool:
        """With ranks: form the group once every rank has arrived (actors/learner_rank.py)."""
        if self.leader.missing():
            return False
        self.trainee.shard(lambda full_model, restored: lead(self.leader, full_model, self.cfg, restored))
        return True

    def receiveMsg_WakeupMessage(self, msg, sender):
        self._report_evals()
        if not self.rewound.is_set() and not self._rewind():       # a full disk: try again later
            self._report_disk()
            self.wakeupAfter(timedelta(seconds=disk.RETRY_S))
            return
        if self.leader is not None and self.trainee.group is None and not self._join_ranks():
            self.wakeupAfter(timedelta(seconds=POLL_S))
            return
        if self.finishing is not None or self.to_quarantine.waiting:
            # paused on a full disk: try the writes again, pull nothing
            self._quarantine_waiting()
            if self.finishing is not None:
                self._finish_step()
            self._report_disk()
            still_full = self.finishing or self.to_quarantine.waiting
            self.wakeupAfter(timedelta(seconds=disk.RETRY_S if still_full else POLL_S))
            return
        self._report_disk()
        try:
            batch = self.ready.get_nowait()
        except queue.Empty:
            batch = None
        if batch is not None:
            for group_id, cause in batch["quarantined"]:
                self._quarantined(group_id, cause)
            if batch["quarantined"]:
                self._send_counts()
            if batch["samples"] is not None and self.step < self.train_cfg["steps"]:
                self._train(batch)
        finished = self.step >= self.train_cfg["steps"] and not self.evals.running
        self.wakeupAfter(timedelta(seconds=0 if batch is not None else FINISHED_POLL_S if finished else
                                   self._pause(POLL_S)))

    def _untrainable(self, group_ids: list[str], cause: str) -> None:
        """A batch the loss refused: its groups are quarantined with the cause, training goes on."""
        log.error("%s: a batch cannot be trained (%s); its groups are quarantined", self.model_name, cause)
        self.to_quarantine.add(group_ids, cause)
        self._quarantine_waiting()
        with self.pulled_lock:
            self.pulled -= 1        # the prefetcher may take one more batch in its place
        self._send_counts()

    def _quarantine_waiting(self) -> None:
        """Quarantine the groups that wait (store/quarantine_queue.py: a full disk may keep some)."""
        for group_id, cause in self.to_quarantine.flush():
            self._quarantined(group_id, cause)
        self.disk_causes["quarantine"] = self.to_quarantine.cause

    def _quarantined(self, group_id: str, cause: str) -> None:
        log.error("%s: group %s quarantined: %s", self.model_name, group_id, cause)
        self.send(self.registry, proto.Quarantined(self.model_name, group_id, cause))

    def _send_counts(self) -> None:
        if self.store is not None:
            self.send(self.registry, proto.StoreCounts(self.model_name, self.store.counts()))

    def _train(self, batch: dict) -> None:
        """One step: drop stale tokens, train, publish the new weights, then tell everyone."""
        times = StepTimes(time.perf_counter())
        group_ids = batch["group_ids"]
        fresh = keep_fresh(batch["samples"], self.version, self.train_cfg["max_staleness"])
        times.trained = time.perf_counter()
        t = self.trainee
        try:
            samples = fresh.samples
            if t.group and samples:       # the other ranks get the batch first, then all step
                samples = t.commands.post("step", samples)
            info = {"tokens": 0, "sequences": 0, "skipped": True}
            if samples:
                info = grpo_step(t.model, t.optimizer, samples, self.algo, self.pad_id, t.ref_model,
                                 ranks=t.group, critic=t.critic)
        except (BadBatch, ValueError, IndexError, TypeError) as e:   # the data's fault, not the learner's
            self._untrainable(group_ids, f"learner: {type(e).__name__}: {e}")
            return
        times.published = time.perf_counter()
        self.step += 1
        self.version += 1
        self.finishing = {"stage": "record", "batch": batch, "fresh": fresh, "info": info, "times": times}
        self._finish_step()

    def _finish_step(self) -> None:
        """What a trained step writes, in order: the groups marked trained, the new weight
        version (then the engines told), the metrics line and Trained, a checkpoint when due.
        A full disk stops it where it failed; the wakeup tries that again every RETRY_S and
        no batch is pulled meanwhile: training pauses, and goes on by itself (actorjet/disk.py)."""
        f, done = self.finishing, self.step >= self.train_cfg["steps"]
        try:
            if f["stage"] == "record":
                self.store.trained(f["batch"]["group_ids"], self.step)
                f["stage"] = "publish"
            if f["stage"] == "publish":
                f["pushed_s"] = self._deliver(self._publish())
                if "times" in f:
                    f["times"].done = time.perf_counter()
                f["stage"] = "report" if "batch" in f else "done"
            if f["stage"] == "report":
                self._report_step(f, done)
                f["stage"] = "checkpoint"
            if f["stage"] == "checkpoint" and (self.step % self.cfg["checkpoint_every"] == 0 or done):
                self._checkpoint()
        except Exception as e:
            if not disk.is_full(e):
                raise
            if "batch" in f:
                self.disk_causes["step"] = f"step {self.step} waits to {f['stage']}: {disk.describe(e)}"
            else:
                self.disk_causes["step"] = (f"the resumed weights v{self.version} wait to be published: "
                                            f"{disk.describe(e)}")
            return
        self.finishing, self.disk_causes["step"] = None, ""

    def _report_step(self, f: dict, done: bool) -> None:
        batch = f["batch"]
        tasks = {t: v["groups"] for t, v in batch["stats"].get("by_task", {}).items()}
        commands = self.trainee.commands
        rank_times = commands.step_times(self.trainee.group.world) if commands else None
        record = step_record(self.model_name, self.step, self.version, batch, f["fresh"], f["info"], f["times"],
                             self.published_bytes, f["pushed_s"], rank_times)
        self._metric(record)          # before Trained: whoever sees the step in status finds its line
        self._metric(timeline_record(self.model_name, self.step, self.version, batch, f["times"]))
        if self.step % self.cfg["eval_every"] == 0 or done:
            self._evaluate(last=done)
        evaluating = done and bool(self.evals.running)
        trained = proto.Trained(self.model_name, self.step, self.version, len(batch["group_ids"]), done, tasks,
                                evaluating=evaluating)
        self.send(self.registry, trained)
        self._send_counts()

    def _report_disk(self) -> None:
        cause = "; ".join(c for c in self.disk_causes.values() if c)
        if cause != self.disk_reported:
            (log.error if cause else log.info)("%s: %s", self.model_name, cause or "the disk has room again")
            self.disk_reported = cause
            self.send(self.registry, proto.DiskFull(f"learner.{self.model_name}", cause))

    def _evaluate(self, last: bool = False) -> None:
        """Held-out accuracy of the weights as they are now (models/evaluations.py: in a thread,
        reported by a later wakeup; ``last`` is never skipped)."""
        self._report_evals()
        if not self.evals.start(self.trainee.full_model, self.step, self.version, last) and self.evals.specs:
            log.info("%s step %d: held-out evaluation skipped, two are still running", self.model_name, self.step)

    def _report_evals(self) -> None:
        """Send the lines of finished evaluations, oldest first, and score their checkpoints."""
        for records in self.evals.finished():
            for record in records:
                self._metric(record)
                self.trainee.record_score(record["step"], record["accuracy"])
                log.info("%s step %d: held-out accuracy on %s %.3f", self.model_name, record["step"],
                         record["task"], record["accuracy"])
            self.send(self.registry, proto.Evaluated(self.model_name, records[0]["step"]))

    def _metric(self, record: dict) -> None:
        """metrics.jsonl is the head's (the registry writes it): this node may be another."""
        self.send(self.registry, m.Metric({"time": time.time(), **record}))

    def _checkpoint(self) -> None:
        t0 = time.perf_counter()
        self.trainee.checkpoint(self.step, self.version, self.tokenizer)
        # Retention: a restarted learner rewinds to this checkpoint, so what it trained up to
        # here is never needed again (exported first with [train] keep_trajectories).
        archive = None
        if self.train_cfg.get("keep_trajectories"):
            archive = self.run_dir / "trajectories" / f"{self.model_name}.jsonl"
        self.store.retain(self.step, archive=archive, keep_closed_s=2 * self.train_cfg["episode_max_s"])
        self._metric({"kind": "checkpoint", "model": self.model_name, "step": self.step,
                      "checkpoint_s": round(time.perf_counter() - t0, 4)})

    def on_stop(self) -> None:
        if getattr(self, "trainee", None) is not None:
            with contextlib.suppress(Exception):      # (the other ranks may be gone already)
                self.trainee.stop_ranks()
        if getattr(self, "evals", None) is not None:
            self.evals.shutdown()
        if getattr(self, "stopping", None) is not None:
            self.stopping.set()
            self.prefetcher.join(timeout=5)
        if getattr(self, "store", None) is not None:
            self.store.close_db()

    def info(self) -> dict:
        return {"path": self.path, "step": getattr(self, "step", None), "version": getattr(self, "version", None)}
