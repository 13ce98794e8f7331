"""issue 49: every collective of rl/ranks.py runs on the group's device.

nccl takes GPU tensors only; the first run on a GPU crashed in ``all_sum`` on a CPU tensor
("No backend type associated with device type cpu").  Here a process group whose backend
serves CUDA tensors only is simulated on the CPU (torch's fake process group, registered for
"cuda" alone): it refuses a CPU tensor with that very error.  Each collective must ask for
the group's device instead: on a machine without a GPU that ends in torch's "not compiled
with CUDA" (what it asked for does not exist here); with one, the fake collective succeeds.
"""
import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import _create_fake_pg

from actorjet.rl import ranks


@pytest.fixture
def cuda_only_group():
    if "simcuda" not in dist.Backend.backend_list:
        dist.Backend.register_backend("simcuda", _create_fake_pg, extended_api=True, devices=["cuda"])
    dist.init_process_group("simcuda", store=dist.HashStore(), rank=0, world_size=2)
    try:
        yield ranks.RankGroup(0, 2)
    finally:
        dist.destroy_process_group()


def test_the_simulated_group_refuses_a_cpu_tensor_as_nccl_does(cuda_only_group):
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.tensor([1.0]))
    assert ranks.group_device().type == "cuda"


@pytest.mark.parametrize("collective", ["all_sum", "broadcast_bytes", "broadcast_weights"])
def test_every_collective_runs_on_the_groups_device(cuda_only_group, collective):
    calls = {"all_sum": lambda: cuda_only_group.all_sum([1.0, 2.0]),
             "broadcast_bytes": lambda: ranks._broadcast_bytes(b"step", 4),
             "broadcast_weights": lambda: ranks.broadcast_weights(torch.nn.Linear(2, 2))}
    if torch.cuda.is_available():
        calls[collective]()
        return
    with pytest.raises((AssertionError, RuntimeError)) as e:
        calls[collective]()
    assert "No backend type associated" not in str(e.value)
    assert "CUDA" in str(e.value)


def test_a_gloo_group_keeps_cpu_tensors():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert ranks.group_device() == torch.device("cpu")
        assert ranks.RankGroup(0, 1).all_sum([1.5, 2.0]) == [1.5, 2.0]
        assert ranks._broadcast_bytes(b"abc", 3) == b"abc"
    finally:
        dist.destroy_process_group()
