"""The learner's trainable model: the base in float32 master weights, with a LoRA adapter when
the model entry asks for one, or restored from a checkpoint; and its optimizer.

With LoRA the learner trains ``peft``'s base model in place and saves through the peft
wrapper (a checkpoint holds the adapter only, so restoring loads the base from the source).
"""
from __future__ import annotations

from pathlib import Path

import torch

from actorjet.rl import exact_attention, lora
from actorjet.runtime import gpus


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
    if cfg.get("activation_checkpointing"):
        checkpointing(model)
    return model.to(gpus.resolve(cfg["device"])), peft


def checkpointing(model) -> None:
    """Keep only each decoder layer's input in the forward pass and recompute the rest in the
    backward: a 32k-token sample's activations would otherwise be most of a GPU (issue 49).
    Non-reentrant, so a LoRA model whose frozen embeddings need no gradient still gets one."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def optimizer(model, cfg: dict, checkpoint: Path | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable tensors only (with LoRA: the adapter's), with the state of
    ``checkpoint`` when restoring."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"], weight_decay=0.0)
    if checkpoint is not None:
        restore_optimizer(model, opt, torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=False))
    return opt


def optimizer_state(model, opt: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter names, whole (gathered on rank 0 when the model
    is sharded over learner ranks: a collective, every rank calls it): the checkpoint's form,
    which any number of ranks can load."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def restore_optimizer(model, opt: torch.optim.Optimizer, state: dict, from_rank0: bool = False) -> None:
    """Load ``optimizer_state``'s form (``from_rank0``: sharded ranks, only rank 0 passes the
    state, the others ``{}``), or an older checkpoint's ``optimizer.state_dict()`` (keyed by
    position: one rank only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if state and all(isinstance(k, int) for k in state.get("state", {})) and not from_rank0:
        opt.load_state_dict(state)
        return
    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True,
                                                                         broadcast_from_rank0=from_rank0))
