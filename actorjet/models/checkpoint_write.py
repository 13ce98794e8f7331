"""Writing a checkpoint: whole or not at all.

A learner killed mid-write, or one that meets a full disk, must leave nothing a restarted
learner (which resumes from the newest ``step_*/state.json``) or ``actorjet export`` would
take for a checkpoint.  So the files go into ``tmp.step_N`` first, and the folder is renamed
to ``step_N`` once complete (a rename on one file system is atomic); a failed write removes
its folder, giving its space back; one that failed on a full disk says so (actorjet/disk.py).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from actorjet import disk


def newest(folder: Path) -> Path | None:
    """The newest complete checkpoint under ``folder`` (one model's), or None: a folder is a
    checkpoint once it is named ``step_N`` with its state.json, which ``write`` makes so last."""
    done = sorted(folder.glob("step_*/state.json"))
    return done[-1].parent if done else None


def write(folder: Path, step: int, weight_version: int, model, tokenizer, optimizer_state: dict,
          extra: dict | None = None) -> Path:
    """``model``: what ``save_pretrained`` saves (with LoRA: the peft model, i.e. the adapter);
    ``optimizer_state``: models/trainable.py ``optimizer_state``; ``extra``: file name → object
    saved with torch.save (PPO's critic: rl/critic.py)."""
    final = folder / f"step_{step:06d}"
    partial = folder / f"tmp.{final.name}"         # never matched by step_*/state.json
    for stale in folder.glob("tmp.step_*"):        # (one the learner was killed writing)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        with open(partial / "optimizer.pt", "wb") as f:      # (closed here even when the write fails)
            torch.save(optimizer_state, f)
        for name, obj in (extra or {}).items():
            with open(partial / name, "wb") as f:
                torch.save(obj, f)
        (partial / "state.json").write_text(json.dumps({"step": step, "weight_version": weight_version}))
    except Exception as e:       # (a full disk: the partial folder's space goes back)
        error = disk.blame_full_disk(e, folder)
        shutil.rmtree(partial, ignore_errors=True)
        if error is e:
            raise
        raise error from e
    shutil.rmtree(final, ignore_errors=True)       # (one of this step, written before a restart)
    os.replace(partial, final)
    return final
