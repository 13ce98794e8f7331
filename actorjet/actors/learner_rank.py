"""Learner ranks above 0: one model trained by several processes (``learner = { ranks = N }``).

Rank 0 is the model's learner (actors/learner.py): it alone pulls batches from the episode
store, publishes weight versions, evaluates and checkpoints.  Every other rank is this
actor, and it does what rank 0 says, in the order rank 0 says it:

    find rank 0's rendezvous (the model's ``ranks`` service in the directory) → join its
    group → take rank 0's weights (fresh, or its node's checkpoint) → shard with FSDP2 →
    then, command by command: train my share of this batch | help gather the weights |
    help gather the optimizer state | restore the optimizer from rank 0's → until rank 0 goes.

The loop runs in a thread, so the actor still answers pings and exit requests.  Any failure
in it (rank 0 died: its store and its sockets close) ends this process; the ranks are
one_for_all children of their own supervisor (runtime/head.py ``with_learner_ranks``), so
every rank then restarts and rank 0 resumes from its checkpoint, rewinding the store.
"""
from __future__ import annotations

import copy
import threading
import time
from urllib.parse import urlsplit

import torch

from actorjet.models import trainable
from actorjet.models.prepare import model_config_here, preload_libraries
from actorjet.rl import ranks
from actorjet.rl.algorithms import from_config
from actorjet.rl.grpo import BadBatch, grpo_step
from actorjet.runtime import endpoints, guarded
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.logs import log
from actorjet.serving import threads

preload = preload_libraries      # runtime/kinds.py: imported once by the head, before forking

RETRY_S = 1.0        # a rendezvous address that does not answer (a rank 0 that is gone) is tried again
RENDEZVOUS_S = 120.0  # how long a started group waits on a collective (gloo's timeout)


class LearnerRank(ManagedActor):
    def on_init(self) -> None:
        from transformers import AutoTokenizer

        job = self.context["job"]
        self.model_name, self.rank, self.world = self.args["model"], int(self.args["rank"]), int(self.args["world"])
        self.cfg = model_config_here(job, self.model_name, claim_gpu=True)
        torch.manual_seed(job["train"]["seed"])
        tokenizer = AutoTokenizer.from_pretrained(self.cfg["path"])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.model, _ = trainable.build(self.cfg)
        threads.configure(self.cfg["threads"], self.cfg["device"], self.model.num_parameters())
        self.algo = from_config(self.cfg)
        self.ref_model = trainable.base(self.cfg).to(self.cfg["device"]).eval() if self.cfg["kl"] > 0 else None
        self.rendezvous = ""             # rank 0's "host:port", from the directory
        self.stopping = threading.Event()
        self.worker: threading.Thread | None = None
        self.steps = 0
        self.announce(self.model_name, {}, subscribe=True)

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        url = (msg.services.get(self.model_name, {}).get("ranks") or {}).get("url")
        if url:
            self.rendezvous = url
        if self.rendezvous and self.worker is None:
            self.worker = guarded.start(self._serve, f"rank{self.rank}.{self.model_name}")

    def _join(self) -> tuple | None:
        """Join rank 0's group at the newest address the directory gave (a restarted rank 0
        announces a new one; an old one refuses at once)."""
        while not self.stopping.is_set():
            address = self.rendezvous
            parts = urlsplit(f"//{address}")
            try:
                return ranks.follow(self.rank, self.world, parts.hostname, parts.port, self.cfg["device"],
                                    RENDEZVOUS_S, own_address=endpoints.advertise_host())
            except RuntimeError as e:
                log.warning("%s rank %d: %s; trying again", self.model_name, self.rank, e)
                self.stopping.wait(RETRY_S)
        return None

    def _serve(self) -> None:
        joined = self._join()
        if joined is None:
            return
        group, commands = joined
        ranks.broadcast_weights(self.model)
        self.model = ranks.shard(self.model)
        optimizer = trainable.optimizer(self.model, self.cfg)
        log.info("%s rank %d/%d joined rank 0 at %s and sharded its model", self.model_name, self.rank,
                 self.world, self.rendezvous)
        while (command := commands.receive(self.stopping)) is not None:
            kind, payload = command
            if kind == "stop":
                break
            if kind == "step":
                t0 = time.perf_counter()
                try:
                    grpo_step(self.model, optimizer, payload, self.algo, self.pad_id, self.ref_model, ranks=group)
                except (BadBatch, ValueError, IndexError, TypeError) as e:   # rank 0 quarantines the groups
                    log.warning("%s rank %d: the batch was refused: %s", self.model_name, self.rank, e)
                self.steps += 1
                commands.report(self.rank, time.perf_counter() - t0)
            elif kind == "weights":
                ranks.gather_into(self.model, None, trainable_only=True)
            elif kind == "optimizer":
                trainable.optimizer_state(self.model, optimizer)
            elif kind == "restore_optimizer":
                trainable.restore_optimizer(self.model, optimizer, {}, from_rank0=True)
            else:
                raise RuntimeError(f"rank {self.rank}: unknown command {kind!r} from rank 0")
        ranks.leave()

    def on_stop(self) -> None:
        if getattr(self, "stopping", None) is not None:
            self.stopping.set()

    def info(self) -> dict:
        return {"path": self.path, "rank": getattr(self, "rank", None), "steps": getattr(self, "steps", None)}


def lead(leader: ranks.Leader, full_model, cfg: dict, restored_optimizer: dict | None) -> tuple:
    """Rank 0's side, once every rank has arrived: form the group, give every rank rank 0's
    weights (and optimizer state, when it resumed from a checkpoint only its node holds), and
    shard a copy of the whole model for training.  The whole model stays on rank 0 for
    evaluations and checkpoints.  Returns (group, commands, sharded model, its optimizer)."""
    group = leader.join(cfg["device"])
    commands = ranks.Commands(leader.store)
    ranks.broadcast_weights(full_model)
    model = ranks.shard(copy.deepcopy(full_model))
    optimizer = trainable.optimizer(model, cfg)
    if restored_optimizer is not None:
        commands.post("restore_optimizer")
        trainable.restore_optimizer(model, optimizer, restored_optimizer, from_rank0=True)
    log.info("learner ranks: %d joined at %s", group.world, leader.url)
    return group, commands, model, optimizer
