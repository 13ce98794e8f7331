"""How many torch threads an engine or learner process gets on the CPU.

Several torch processes share the machine (engine, learner, runners).  For a small model
the ops are too small to gain from intra-op threads and oversubscribed OpenMP pools cost
more than they give (measured: a 65 ms learner step took 1.7 s with 2 threads in each
process on 2 cores); a large model's matrix products do gain.  ``0`` means: 1 thread
under 20M parameters, otherwise every core.  OMP_WAIT_POLICY=PASSIVE (set for actor
processes when a node starts its actor system) keeps idle pools from spinning.
"""
from __future__ import annotations

import os

import torch

SMALL_MODEL_PARAMS = 20_000_000


def configure(requested: int, device: str, n_params: int) -> int:
    if device != "cpu":
        return torch.get_num_threads()
    threads = requested or (1 if n_params < SMALL_MODEL_PARAMS else (os.cpu_count() or 1))
    torch.set_num_threads(threads)
    return threads
