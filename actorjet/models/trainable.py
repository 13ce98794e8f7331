"""The learner's trainable model: the base in float32 master weights, with a LoRA adapter when
the model entry asks for one, or restored from a checkpoint; and its optimizer.

With LoRA the learner trains ``peft``'s base model in place and saves through the peft
wrapper (a checkpoint holds the adapter only, so restoring loads the base from the source).
"""
from __future__ import annotations

from pathlib import Path

import torch

from actorjet.rl import exact_attention, lora


def load_kwargs(cfg: dict) -> dict:
    """float32 master weights; ``attention = "exact"`` swaps in the layout-independent
    attention kernel (rl/exact_attention.py)."""
    kwargs = {"dtype": torch.float32}
    if cfg.get("attention") == "exact":
        kwargs["attn_implementation"] = exact_attention.register()
    return kwargs


def base(cfg: dict, path: str | Path | None = None):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path or cfg["path"], **load_kwargs(cfg))


def build(cfg: dict, checkpoint: Path | None = None) -> tuple:
    """(model, peft wrapper or None) on the model's device: fresh from the source, or the
    weights of ``checkpoint``."""
    peft = None
    if cfg.get("lora"):
        peft = lora.load(base(cfg), str(checkpoint), trainable=True) if checkpoint else lora.attach(base(cfg), cfg["lora"])
        model = peft.get_base_model()
    else:
        model = base(cfg, checkpoint)
    return model.to(cfg["device"]), peft


def optimizer(model, cfg: dict, checkpoint: Path | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable tensors only (with LoRA: the adapter's), with the state of
    ``checkpoint`` when restoring."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"], weight_decay=0.0)
    if checkpoint is not None:
        opt.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=False))
    return opt
