"""Learner ranks: one model trained by several processes, its parameters sharded with FSDP2.

Every rank receives the whole batch (rank 0 pulls it from the episode store) and trains on
its **share**: the packed samples split by tokens, the same split computed on every rank, so
no rank waits on another to know its work.  The loss keeps the batch's *global* token count
as its denominator and the ranks' gradients are summed (``shard``), so a step's gradient is the one a single rank computes on the whole batch: the
ranks change who computes, not what.

FSDP2 runs a collective in every forward and backward of a sharded module, so every rank must
run as many micro-batches as the busiest one: a rank with fewer runs empty ones (no terms,
zero loss) to keep step with the others.

On CPU the process group is ``gloo`` and FSDP2 shards over it as on GPUs (``nccl``): the
same code path, tested here on 2 CPU processes (tests/test_ranks.py).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class RankGroup:
    """Where this process sits among the model's learner ranks."""
    rank: int
    world: int

    def share(self, samples: list[dict]) -> list[dict]:
        """This rank's samples (see ``shares``)."""
        return shares(samples, self.world)[self.rank]

    def all_sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64, so the metrics match one rank's)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()


def shares(samples: list[dict], world: int) -> list[list[dict]]:
    """Split samples over ``world`` ranks, longest first to the rank with the fewest tokens so
    far (ties to the lower rank): deterministic, so every rank computes the same split."""
    out: list[list[dict]] = [[] for _ in range(world)]
    load = [0] * world
    for s in sorted(samples, key=lambda s: -len(s["input_ids"])):
        r = min(range(world), key=lambda k: (load[k], k))
        out[r].append(s)
        load[r] += len(s["input_ids"])
    return out


EMPTY = {"input_ids": [0], "position_ids": [0], "parents": [-1], "linear": True, "terms": []}


def join(rank: int, world: int, address: str, port: int, device: str = "cpu", timeout_s: float = 60.0) -> RankGroup:
    """Rendezvous at rank 0's TCPStore (``address:port``, reachable from every rank's host);
    ``gloo`` on CPU, ``nccl`` on CUDA.  A rendezvous nobody completes raises a one-line
    RuntimeError naming the address, instead of hanging."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    try:
        store = dist.TCPStore(address, port, world, is_master=rank == 0,
                              timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, OSError, dist.DistError) as e:
        raise RuntimeError(f"learner rank {rank}/{world}: no rendezvous at {address}:{port} within "
                           f"{timeout_s:.0f} s ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    return RankGroup(rank, world)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder layer its own unit (its parameters gathered only while it runs),
    then the rest.  FSDP2 averages the ranks' gradients; the step multiplies each rank's loss
    by the rank count so the average is the sum (a divide factor of 1 would be simpler, but
    gloo has no pre-multiplied sum)."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers or []:
        fully_shard(layer)
    fully_shard(model)
    return model


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's tensors on every rank (for publishing a weight version; CPU copies)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
