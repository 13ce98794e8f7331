"""LoRA adapters through peft: the learner trains the adapter only, the engine serves base +
adapter, and a weight version is an adapter version (a few MB instead of the whole model).

Both sides attach the same adapter to the same base with ``attach`` and then work on the
*base* model object, whose layers peft has wrapped in place: its ``forward`` is the model's
own (the engine's cache keyword, the learner's hidden-state path), and its parameter names
are the same in the learner and the engine, so a published adapter loads by name.  B starts
at zero, so version 0 (no adapter published yet) is the base model exactly.

Dropout defaults to 0: the learner's logprobs must equal the engine's for the importance
ratio to mean anything.  No torch import at module level: job configs are checked here in
the head process, which must stay light.
"""
from __future__ import annotations


from actorjet.checks import int_in, number_in
from actorjet.errors import UserError

MAX_RANK = 4096           # beyond any model's width: a larger r is a typo, not an adapter
DEFAULTS = {"r": 16, "alpha": 32.0, "target_modules": "all-linear", "dropout": 0.0}
ADAPTER = "default"        # peft's adapter name: it is part of every LoRA parameter's name


def check(cfg: dict, where: str) -> dict:
    """A model's ``lora`` table, with defaults; ``{}`` means no LoRA (full fine-tuning)."""
    if not cfg:
        return {}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise UserError(f"{where}: lora: unknown field {unknown[0]!r} (known: {', '.join(sorted(DEFAULTS))})")
    out = {**DEFAULTS, **cfg}
    if not int_in(out["r"], 1, MAX_RANK):
        raise UserError(f"{where}: lora: r must be an integer from 1 to {MAX_RANK}, got {out['r']!r}")
    for key in ("alpha", "dropout"):
        value = out[key]
        if not number_in(value, 0):
            raise UserError(f"{where}: lora: {key} must be a finite number >= 0, got {value!r}")
    if not 0 <= out["dropout"] < 1:
        raise UserError(f"{where}: lora: dropout must be in [0, 1), got {out['dropout']!r}")
    targets = out["target_modules"]
    if not (isinstance(targets, str) and targets) and not (
            isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):
        raise UserError(f"{where}: lora: target_modules must be \"all-linear\", a module name or a list of "
                        f"them, got {targets!r}")
    out["alpha"] = float(out["alpha"])
    return out


def peft_config(cfg: dict):
    from peft import LoraConfig

    return LoraConfig(r=cfg["r"], lora_alpha=cfg["alpha"], target_modules=cfg["target_modules"],
                      lora_dropout=cfg["dropout"], bias="none", task_type="CAUSAL_LM")


def attach(model, cfg: dict):
    """Wrap ``model``'s layers with a fresh adapter; returns the peft model (for saving and
    merging).  Everything but the adapter is frozen.  Train and serve ``peft.get_base_model()``."""
    try:
        from peft import get_peft_model
    except ImportError:
        raise UserError("lora needs peft (a dependency of actorjet): pip install peft") from None
    try:
        return get_peft_model(model, peft_config(cfg))
    except ValueError as e:       # e.g. target_modules that name no layer of this model
        raise UserError(f"lora: {e}") from None


def load(model, folder: str, trainable: bool):
    """The base ``model`` with the adapter saved in ``folder`` (peft's format: a checkpoint)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, folder, is_trainable=trainable)


def adapter_tensors(model) -> dict:
    """The adapter's tensors of a base model that ``attach`` wrapped, by their names in it."""
    return {name: p for name, p in model.named_parameters() if "lora_" in name}


def merged(peft_model):
    """The base model with the adapter folded into its weights: a plain transformers model."""
    return peft_model.merge_and_unload()


def peft_names(tensors: dict) -> dict:
    """Published adapter tensors (names in the wrapped base model) under the names peft's own
    files use, which vLLM and ``PeftModel.from_pretrained`` read."""
    return {"base_model.model." + name.replace(f".{ADAPTER}.", "."): t for name, t in tensors.items()}


def target_names(tensors: dict) -> list[str]:
    """The module names an adapter touches (``"all-linear"`` resolved), for an adapter_config."""
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors})


def save_peft_dir(tensors: dict, cfg: dict, base_path: str, out) -> None:
    """An adapter directory in peft's format (adapter_config.json + adapter_model.safetensors)."""
    from pathlib import Path
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config({**cfg, "target_modules": target_names(tensors)})
    config.base_model_name_or_path = str(base_path)
    config.save_pretrained(str(out))
    save_file({k: v.detach().contiguous() for k, v in peft_names(tensors).items()},
              str(out / "adapter_model.safetensors"))
