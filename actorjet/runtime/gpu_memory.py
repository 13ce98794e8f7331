"""How much of a GPU each process of a model may use, decided once at its start.

Why: a fixed 1 GB budget for kept KV caches (``prefix_cache_mb``) made one 32k-token
conversation of an 8B model re-read its whole context every turn (its KV is 4.3 GB): turn 50
took 8.3x turn 1 on an H200 (issue 49).  vLLM sizes its KV cache from the device instead:
``gpu_memory_utilization`` (0.92 by default) of the GPU, minus the weights and the activations
it measured.  Here the same, with one more party: an engine and a learner of one model often
share a GPU.  Each declares its share of the device; the engine's KV budget is what is left of
its share after its weights and a headroom for a batch's activations, and a share that cannot
hold its weights is a one-line error at start, not an out-of-memory error an hour later.

On the CPU nothing changes: 1024 MB.  ``prefix_cache_mb`` set in the job overrides both.
"""
from __future__ import annotations

from dataclasses import dataclass

from actorjet.errors import UserError

GIB = 1024 ** 3


@dataclass
class Shares:
    """Fractions of one GPU's memory: the engine's and the learner's when they share it."""
    utilization: float = 0.92          # all of this model's processes on one GPU (vLLM's default)
    learner: float = 0.4               # the learner's part of it, when it shares the engine's GPU

    def engine(self, shared: bool) -> float:
        return self.utilization - self.learner if shared else self.utilization

    def learner_share(self, shared: bool) -> float:
        return self.learner if shared else self.utilization


def shares_of(cfg: dict) -> Shares:
    """The model's shares as its job declares them (config.py checked their range)."""
    return Shares(float(cfg.get("gpu_memory_utilization", 0.92)), float(cfg.get("learner_gpu_memory", 0.4)))


def shares_gpu(cfg: dict, gpus_here: int) -> bool:
    """Whether this model's engine and learner share a GPU: they do when this machine has
    fewer GPUs than the model's GPU processes (runtime/gpus.py gives each process the least
    claimed GPU, so with enough GPUs each has its own)."""
    if not cfg.get("trainable", True):
        return False
    processes = int(cfg.get("engines", 1)) + int((cfg.get("learner") or {}).get("ranks", 1))
    return gpus_here < processes


def engine_share(cfg: dict, gpus_here: int) -> float:
    return shares_of(cfg).engine(shares_gpu(cfg, gpus_here))


def headroom_bytes(config, max_batch: int, element: int) -> int:
    """What a batch's activations may take beside the weights and the kept caches: the
    sampler's fp32 logits (three tensors of rows x vocabulary) and a whole-context prefill's
    MLP activations, plus 1 GiB for the allocator's slack and the CUDA context."""
    logits = 3 * max_batch * config.vocab_size * 4
    prefill = 3 * int(getattr(config, "max_position_embeddings", 4096)) * config.intermediate_size * element
    return logits + prefill + GIB


def total_bytes(device: str) -> int:
    import torch

    return torch.cuda.get_device_properties(torch.device(device)).total_memory


def kv_budget_mb(total: int, share: float, weight_bytes: int, headroom: int, name: str = "",
                 device: str = "cuda") -> float:
    """A GPU engine's budget for kept KV caches: its ``share`` of the device's ``total`` bytes
    less its weights and ``headroom``; a share that cannot hold them is a one-line UserError."""
    budget = share * total - weight_bytes - headroom
    if budget <= 0:
        raise UserError(
            f"model {name!r}: its engine's share of {device} ({share:.2f} x {total / GIB:.0f} GiB) does not hold "
            f"its weights ({weight_bytes / GIB:.1f} GiB) and a batch's activations ({headroom / GIB:.1f} GiB): "
            "raise gpu_memory_utilization, lower learner_gpu_memory, or give the engine a GPU of its own")
    return budget / 2 ** 20


def reserve(device: str, nbytes: int) -> None:
    """Ask the CUDA allocator for ``nbytes`` once and give them back to its cache: later KV
    caches are carved from that segment instead of growing the process turn by turn (the
    first episode of a process ran 2.2x slower at turn 50 than the second, while it grew)."""
    if not device.startswith("cuda") or nbytes <= 0:
        return
    import torch

    block = torch.empty(int(nbytes), dtype=torch.uint8, device=device)
    del block


def limit_learner(cfg: dict, device: str, gpus_here: int) -> float:
    """Cap this learner's allocations at its share of the GPU (the engine's share stays the
    engine's); returns the share."""
    if not device.startswith("cuda"):
        return 1.0
    import torch

    share = shares_of(cfg).learner_share(shares_gpu(cfg, gpus_here))
    torch.cuda.set_per_process_memory_fraction(share, torch.device(device))
    return share


def check_learner_fits(cfg: dict, device: str, model, share: float) -> None:
    """A learner whose weights, gradients and AdamW moments cannot fit its share of the GPU
    says so at start, in one line, instead of an out-of-memory error at its first step."""
    if not device.startswith("cuda"):
        return
    total = total_bytes(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() * (p.element_size() + 8) for p in model.parameters() if p.requires_grad)
    if weights + trained > share * total:
        raise UserError(f"model {cfg.get('name', '?')!r}: its learner needs {(weights + trained) / GIB:.1f} GiB for "
                        f"weights, gradients and optimizer state, more than its share of {device} "
                        f"({share:.2f} x {total / GIB:.0f} GiB): raise learner_gpu_memory, train with LoRA, "
                        "or use learner ranks")
