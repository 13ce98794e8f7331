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
same code path, tested here on 2 CPU processes (tests/test_ranks.py).  Every collective of this
module puts its tensor on the group's device first (``on_group``): nccl takes GPU tensors only,
and the first run on a GPU crashed on a CPU tensor (tests/test_collectives.py).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
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
        t = on_group(torch.tensor(values, dtype=torch.float64))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()


def group_device() -> torch.device:
    """Where the group's collectives run: the CPU for gloo, this process's GPU for nccl (which
    refuses CPU tensors: "No backend type associated with device type cpu")."""
    types = [d.type for d in dist.distributed_c10d._get_default_group()._device_types]
    return torch.device("cpu" if "cpu" in types or not types else types[0])


def on_group(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the group's device (itself if there already): every collective of this module
    goes through here.  A bare "cuda" is this process's GPU (runtime/gpus.py sets it)."""
    return t.to(group_device())


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
    if rank == 0:
        return Leader(world, address, port, timeout_s).join(device)
    deadline = time.monotonic() + timeout_s
    while True:                   # rank 0 may not listen yet: the ranks start together
        try:
            return follow(rank, world, address, port, device, timeout_s)[0]
        except NobodyListens:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class NobodyListens(RuntimeError):
    """Nothing listens at the rendezvous address (rank 0 not started yet, or gone)."""


def _rendezvous_error(rank: int, world: int, address: str, port: int, timeout_s: float, e: Exception) -> RuntimeError:
    if isinstance(e, ConnectionRefusedError):
        return NobodyListens(f"learner rank {rank}/{world}: no rendezvous at {address}:{port}: nothing listens there")
    return RuntimeError(f"learner rank {rank}/{world}: no rendezvous at {address}:{port} within "
                        f"{timeout_s:.0f} s ({type(e).__name__}: {str(e).splitlines()[0][:200]})")


def _gloo_interface(address: str) -> None:
    """gloo binds to the interface of the hostname unless told: name the one that carries this
    rank's advertised address (in a network namespace the hostname may resolve elsewhere)."""
    import ipaddress

    import psutil

    try:
        ip = str(ipaddress.ip_address(socket.gethostbyname(address)))
    except (OSError, ValueError):
        return
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
            return


class Leader:
    """Rank 0's side of the rendezvous: a TCPStore the other ranks connect to (``port`` 0:
    any free port; ``url`` is what rank 0 announces), and who has arrived so far, so rank 0
    can wait for late ranks without blocking (``missing``) before the group forms."""

    def __init__(self, world: int, address: str, port: int = 0, timeout_s: float = 60.0):
        self.world, self.address, self.timeout_s = world, address, timeout_s
        try:
            self.store = dist.TCPStore(address, port, world, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, OSError, dist.DistError) as e:
            raise _rendezvous_error(0, world, address, port, timeout_s, e) from None
        self.url = f"{address}:{self.store.port}"

    def missing(self) -> list[int]:
        """The ranks not arrived yet (each change is logged: a rank waiting for its node to be
        placed shows in status as WAITING, and here)."""
        missing = [k for k in range(1, self.world) if not self.store.check([f"here/{k}"])]
        if missing != getattr(self, "reported", None):
            logging.getLogger("actorjet").info("learner rank 0 at %s waits for ranks %s", self.url, missing)
            self.reported = missing
        return missing

    def join(self, device: str = "cpu") -> RankGroup:
        _gloo_interface(self.address)
        try:
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", store=self.store, rank=0,
                                    world_size=self.world, timeout=datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, OSError, dist.DistError) as e:
            raise _rendezvous_error(0, self.world, self.address, self.store.port, self.timeout_s, e) from None
        return RankGroup(0, self.world)


def follow(rank: int, world: int, address: str, port: int, device: str = "cpu", timeout_s: float = 60.0,
           own_address: str | None = None) -> tuple[RankGroup, "Commands"]:
    """A rank above 0 joins rank 0's group at ``address:port``; with it, the channel on which
    rank 0 says what to do next."""
    try:
        # a port nobody listens on (a rank 0 that is gone) fails here at once; TCPStore itself
        # would retry it for the whole timeout
        socket.create_connection((address, port), timeout=min(timeout_s, 5.0)).close()
        store = dist.TCPStore(address, port, world, is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        store.set(f"here/{rank}", "1")
        _gloo_interface(own_address or address)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", store=store, rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, OSError, dist.DistError) as e:
        raise _rendezvous_error(rank, world, address, port, timeout_s, e) from None
    return RankGroup(rank, world), Commands(store)


class Commands:
    """Rank 0 tells the other ranks what to do next (``"step"`` with a batch, ``"weights"``,
    ``"optimizer"``, ``"stop"``).  A rank waits for the next command's header by polling the
    rendezvous store, never inside a collective: a learner may wait minutes for a batch, longer
    than gloo's timeout.  A payload then goes through one broadcast as JSON bytes (the store
    takes at most 8 MB a value): nothing a rank receives is unpickled."""

    def __init__(self, store):
        self.store, self.n = store, 0

    def post(self, kind: str, payload=None):
        """Rank 0: announce ``kind`` and send ``payload``; returns the payload as every rank
        reads it (so rank 0 trains on exactly what the others decoded)."""
        self.n += 1
        data = json.dumps(payload).encode() if payload is not None else b""
        self.store.set(f"cmd/{self.n}", json.dumps({"kind": kind, "bytes": len(data)}))
        if self.n > 2:
            self.store.delete_key(f"cmd/{self.n - 2}")
        return _decode(kind, json.loads(_broadcast_bytes(data, len(data)))) if data else None

    def receive(self, stopping: threading.Event, poll_s: float = 0.05) -> tuple[str, object] | None:
        """Ranks above 0: the next command, or None once ``stopping`` is set."""
        self.n += 1
        key = f"cmd/{self.n}"
        while not self.store.check([key]):
            if stopping.wait(poll_s):
                return None
        head = json.loads(self.store.get(key))
        kind = head["kind"]
        return kind, _decode(kind, json.loads(_broadcast_bytes(None, head["bytes"]))) if head["bytes"] else None

    def report(self, rank: int, step_s: float) -> None:
        self.store.set(f"time/{rank}", str(step_s))

    def step_times(self, world: int) -> list[float | None]:
        """Each rank's last step time as it reported it (rank 0's own is not here)."""
        return [float(self.store.get(f"time/{k}")) if self.store.check([f"time/{k}"]) else None
                for k in range(1, world)]


def _decode(kind: str, payload):
    """A step's samples as JSON gives them back: their terms become rl/pack.py Terms again."""
    if kind == "step":
        from actorjet.rl.pack import Term

        return [{**s, "terms": [Term(*t) for t in s["terms"]]} for s in payload]
    return payload


def _broadcast_bytes(data: bytes | None, size: int) -> bytes:
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None else torch.empty(size, dtype=torch.uint8)
    t = on_group(t)
    dist.broadcast(t, src=0)
    return t.cpu().numpy().tobytes()


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


def broadcast_weights(model: torch.nn.Module) -> None:
    """Every rank, before ``shard``: rank 0's weights (fresh or from a checkpoint, which only
    rank 0's node holds) in every rank's model."""
    for tensor in model.state_dict().values():
        moved = on_group(tensor)
        dist.broadcast(moved, src=0)
        if moved is not tensor:
            tensor.copy_(moved)


def gather_into(model: torch.nn.Module, whole: torch.nn.Module | None, trainable_only: bool = False) -> None:
    """Every rank, together: the sharded model's parameters gathered whole one at a time (an
    all-gather each, in the same order on every rank) and, on rank 0, copied into ``whole``
    (its unsharded copy, which evaluations, checkpoints and weight publishes read; the other
    ranks pass None).  So no rank holds a second whole model while a version is published: one
    parameter more than its shard at most.  ``trainable_only``: frozen tensors never change
    and are skipped (a LoRA publish gathers the adapter alone)."""
    from torch.distributed.tensor import DTensor

    into = dict(whole.named_parameters()) if whole is not None else {}
    if whole is not None and (missing := [n for n, _ in model.named_parameters() if n not in into]):
        raise KeyError(f"the whole copy lacks the sharded model's parameters {missing[:3]}: not the same model")
    with torch.no_grad():
        for name, param in model.named_parameters():        # tied ones once, in module order
            if trainable_only and not param.requires_grad:
                continue
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if whole is not None:
                into[name].copy_(full)
            del full
