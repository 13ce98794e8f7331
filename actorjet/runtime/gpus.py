"""Which GPUs of this machine an engine or learner process uses.

``device = "cuda"`` used to mean ``cuda:0`` in every process: eight learner ranks placed on an
8-GPU node all trained on its first GPU.  Now each GPU process (an engine, a learner, a learner
rank) claims GPUs of the machine it runs on when it starts, and keeps the claim for its life:

- a GPU nobody holds first, the lowest index first; once every GPU is held, the one held by
  the fewest processes (an engine and a learner sharing one GPU is the usual 1-GPU layout);
- a claim is an open lock file per process and GPU (``flock``), so a process that dies, however
  it dies, gives its GPUs back with no bookkeeping, and processes of several jobs on one machine
  (several heads, joined nodes) see each other's claims;
- the claims live in ``$TMPDIR/actorjet-gpus-<CUDA_VISIBLE_DEVICES>``: processes that see the
  GPUs under the same numbering share a folder;
- ``device = "cuda:3"`` is taken as written (no claim): the user chose.

vLLM with ``tensor_parallel_size = T`` claims T GPUs and sees only them (CUDA_VISIBLE_DEVICES,
set before vLLM starts CUDA).  The supervisor places children with ``{ gpus = N }`` only on
nodes whose GPUs its other children do not fill already (runtime/supervisor.py).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

DRIVERS = ("/proc/driver/nvidia", "/dev/kfd")      # NVIDIA's driver, ROCm's
_held: list = []          # this process's open lock files: its claims, for its whole life
_claimed: list[int] = []


def gpu_count() -> int:
    """GPUs here, counted through NVML.  Not ``torch.cuda.is_available()``: that asks the CUDA
    runtime, and a process that has initialised CUDA cannot fork children that use it —
    thespian forks every actor from this process's admin.

    A machine with no GPU driver (neither NVIDIA's /proc/driver/nvidia nor ROCm's /dev/kfd)
    has none, known without importing torch: a CPU-only node's ``actorjet join`` spent 1.5 of
    its 3.1 CPU-s importing torch to count zero GPUs (a runner node never needs torch)."""
    if not any(os.path.exists(driver) for driver in DRIVERS):
        return 0
    try:
        import torch
        return max(torch.cuda.device_count(), 0)
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPUs
        return 0


def folder() -> Path:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    tag = visible if visible.replace(",", "").isalnum() and len(visible) < 40 \
        else hashlib.sha256(visible.encode()).hexdigest()[:12]
    return Path(os.environ.get("AJ_GPU_CLAIMS") or Path(tempfile.gettempdir()) / f"actorjet-gpus-{tag}")


def holders(where: Path, index: int) -> int:
    """Live processes holding GPU ``index`` (a lock file whose lock can be taken is stale)."""
    live = 0
    for path in where.glob(f"gpu{index}-*.lock"):
        try:
            with open(path, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)            # its process is gone
        except BlockingIOError:
            live += 1
        except OSError:
            pass
    return live


def claim(n: int, total: int, where: Path | None = None) -> list[int]:
    """Claim ``n`` of this machine's ``total`` GPUs for this process (see above); the same
    process asking again gets the same ones."""
    if n > total:
        raise RuntimeError(f"{n} GPUs asked for, and this machine has {total}")
    if _claimed:
        return list(_claimed)
    where = where or folder()
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".claiming", "a") as guard:       # one claimer at a time on this machine
        fcntl.flock(guard, fcntl.LOCK_EX)
        load = sorted((holders(where, k), k) for k in range(total))
        chosen = sorted(k for _, k in load[:n])
        for k in chosen:
            f = open(where / f"gpu{k}-{os.getpid()}.lock", "w")
            fcntl.flock(f, fcntl.LOCK_EX)
            _held.append(f)
    _claimed.extend(chosen)
    return chosen


def resolve(device: str, count: int | None = None) -> str:
    """``"auto"`` (the default): CUDA where this machine has a GPU, the CPU otherwise.
    Decided by the process that runs the model, on its own machine: a head without a GPU may
    place a model on a node with one."""
    if device != "auto":
        return device
    return "cuda" if (gpu_count() if count is None else count) > 0 else "cpu"


def device_for(cfg: dict, count: int | None = None) -> str:
    """The device this process's model goes on: ``cfg["device"]`` (``"auto"`` resolved here)
    with a claimed GPU index for a bare ``"cuda"`` (CPU and explicit indices as written).  With vLLM's tensor parallelism
    the process claims that many GPUs and sees only them."""
    device = resolve(cfg.get("device", "auto"), count)
    if device != "cuda":
        return device
    total = gpu_count() if count is None else count
    if total == 0:
        raise RuntimeError("device = \"cuda\" but this machine has no GPU that CUDA can see")
    if cfg.get("engine") == "vllm":
        chosen = claim(int(cfg.get("tensor_parallel_size", 1)), total)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(_physical(k) for k in chosen)
        return "cuda"
    [k] = claim(1, total)
    import torch

    torch.cuda.set_device(k)               # bare "cuda" elsewhere in this process means this GPU
    return f"cuda:{k}"


def _physical(k: int) -> str:
    """GPU ``k`` as CUDA_VISIBLE_DEVICES names it (the machine may already narrow what is seen)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[k] if visible else str(k)
