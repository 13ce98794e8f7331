"""`actorjet export`: a run's trained model as a plain Hugging Face directory.

The newest checkpoint of one model is loaded and written with ``save_pretrained``; a LoRA
checkpoint (an adapter in peft's format) is first merged into its base, so the result loads
in transformers or vLLM as is, with no peft and no ActorJet.  ``actorjet.json`` beside it
says which run, step and weight version it came from.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from actorjet.errors import UserError
from actorjet.models import checkpoint_write


def newest_checkpoint(run_dir: Path, model: str) -> Path:
    folder = checkpoint_write.newest(run_dir / "checkpoints" / model)
    if folder is None:
        known = sorted(p.name for p in (run_dir / "checkpoints").glob("*")) if (run_dir / "checkpoints").is_dir() else []
        raise UserError(f"{run_dir}: no checkpoint of model {model!r}" +
                        (f" (models with checkpoints: {', '.join(known)})" if known else
                         " (a learner writes one every checkpoint_every steps and at the end of training)"))
    return folder


def export(run_dir: str | Path, model: str, out: str | Path) -> dict:
    """Write the merged model to ``out`` (a new or empty directory); returns what was written."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory: choose a new one")
    folder = newest_checkpoint(run_dir, model)
    state = json.loads((folder / "state.json").read_text())
    adapter = folder / "adapter_config.json"
    if adapter.exists():
        from actorjet.rl import lora

        base_path = json.loads(adapter.read_text()).get("base_model_name_or_path") or ""
        if not Path(base_path).is_dir():
            raise UserError(f"{folder}: the adapter's base model {base_path!r} is not on this machine "
                            "(export on the node that ran the learner)")
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
        model_obj = lora.merged(lora.load(base, str(folder), trainable=False))
    else:
        model_obj = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model_obj.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp)
    info = {"run_dir": str(run_dir.resolve()), "model": model, "checkpoint": folder.name, "step": state["step"],
            "weight_version": state.get("weight_version"), "lora_merged": adapter.exists()}
    (tmp / "actorjet.json").write_text(json.dumps(info, indent=1))
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return dict(info, out=str(out))
