"""The model a learner trains (its trainee), and what it keeps of it.

That is: the weights (with LoRA, the peft wrapper and its base), the optimizer, PPO's critic,
the frozen reference a KL term compares with, and, with learner ranks, the whole copy kept
beside the sharded one.  It is built from the newest checkpoint when there is one (a
restarted learner goes on from there) or from the job's source; it gives each new weight
version its tensors and writes checkpoints.

actors/learner.py is the loop that trains it: pull a batch, step, publish, report.  This is
split from it because "what does a restarted learner come back with, and what goes into a
checkpoint or a weight version?" is a question a reader asks on its own (issue 51).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from actorjet.models import checkpoint_retention, checkpoint_write, trainable
from actorjet.rl import critic, lora, ranks


class Trainee:
    def __init__(self, cfg: dict, algo, checkpoints: Path):
        """Built from the newest checkpoint in ``checkpoints`` (this model's folder) if any."""
        self.cfg, self.checkpoints = cfg, checkpoints
        folder = checkpoint_write.newest(checkpoints)
        self.resumed_step = json.loads((folder / "state.json").read_text())["step"] if folder else None
        # with LoRA, ``peft`` is the peft wrapper (saving, merging) and ``model`` its base
        self.model, self.peft = trainable.build(cfg, folder)
        self.optimizer = trainable.optimizer(self.model, cfg, folder)
        self.critic = critic.build(self.model, cfg, algo, folder)       # PPO's value function, else None
        self.ref_model = None
        if cfg["kl"] > 0:
            self.ref_model = trainable.base(cfg).to(cfg["device"]).eval()
        # ``full_*``: the whole model, which evaluations, checkpoints and weight versions read.
        # With one rank it is the model trained.  With ranks (``learner = { ranks = N }``) the
        # trained one is FSDP2-sharded once the group forms (``shard``), and this copy is
        # refreshed from it at every publish.
        self.full_model, self.full_peft = self.model, self.peft
        self.group = self.commands = None

    def shard(self, lead) -> None:
        """With ranks: ``lead(full_model, restored optimizer state)`` forms the group and
        returns (group, commands, sharded model, its optimizer) (actors/learner_rank.py)."""
        restored = None
        if self.resumed_step is not None:
            restored = trainable.optimizer_state(self.model, self.optimizer)
        self.group, self.commands, self.model, self.optimizer = lead(self.full_model, restored)

    def version_tensors(self) -> dict[str, torch.Tensor]:
        """What a weight version holds: the adapter alone with LoRA, else the whole state dict."""
        if self.group is not None:       # the ranks gather the new weights into rank 0's whole copy
            self.commands.post("weights")
            ranks.gather_into(self.model, self.full_model, trainable_only=True)
        if self.peft is not None:
            return lora.adapter_tensors(self.full_model)
        return self.full_model.state_dict()

    def checkpoint(self, step: int, version: int, tokenizer) -> None:
        """Write checkpoint ``step`` (weights or adapter, optimizer, critic), then keep the
        newest ``checkpoint_keep_last`` and the ``checkpoint_keep_best`` best scored."""
        if self.group is not None:        # the ranks gather the optimizer state on rank 0
            self.commands.post("optimizer")
        checkpoint_write.write(self.checkpoints, step, version, self.full_peft or self.full_model, tokenizer,
                               trainable.optimizer_state(self.model, self.optimizer),   # LoRA: the adapter's
                               critic.checkpoint_files(self.critic))
        checkpoint_retention.prune(self.checkpoints, self.cfg["checkpoint_keep_last"],
                                   self.cfg["checkpoint_keep_best"])

    def record_score(self, step: int, accuracy: float) -> None:
        """A held-out score of step ``step``: which checkpoints are the best to keep."""
        checkpoint_retention.record_score(self.checkpoints, step, accuracy)

    def stop_ranks(self) -> None:
        if self.commands is not None:
            self.commands.post("stop")
