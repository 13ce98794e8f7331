"""GPU assignment without a GPU: the claims (runtime/gpus.py) are lock files, so real
processes on this machine claim "GPUs" of a machine said to have four, and the supervisor's
placement rule counts the GPUs its placed children take.  (On a GPU: bench/gpu_check.sh.)"""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from actorjet.runtime import gpus
from actorjet.runtime.supervisor import Supervisor
from actorjet.runtime.tree_spec import ChildSpec
from swarm import REPO

CLAIMER = """
import sys, time
from pathlib import Path
from actorjet.runtime import gpus
n, total, where = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
print(",".join(map(str, gpus.claim(n, total, where))), flush=True)
assert gpus.claim(n, total, where) == gpus.claim(n, total, where)     # asking again: the same ones
time.sleep(600)
"""


@pytest.fixture
def claimers(tmp_path):
    procs = []

    def start(n: int, total: int = 4) -> tuple[subprocess.Popen, list[int]]:
        proc = subprocess.Popen([sys.executable, "-c", CLAIMER, str(n), str(total), str(tmp_path / "claims")],
                                stdout=subprocess.PIPE, text=True, cwd=REPO)
        procs.append(proc)
        line = proc.stdout.readline().strip()
        assert line, f"claimer exited with {proc.wait()}"
        return proc, [int(k) for k in line.split(",")]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_each_process_gets_a_gpu_of_its_own_then_the_least_shared_and_a_dead_ones_comes_back(claimers):
    got = [claimers(1)[1] for _ in range(4)]
    assert sorted(got) == [[0], [1], [2], [3]]                   # four processes, four GPUs of their own
    fifth, [shared] = claimers(1)
    assert shared == 0                                           # all held: the least shared, lowest first
    assert claimers(1)[1] == [1]                                 # 0 now has two holders
    fifth.send_signal(signal.SIGKILL)                            # a SIGKILL gives its claim back
    fifth.wait()
    assert claimers(1)[1] == [0]


def test_tensor_parallel_claims_several_and_asking_too_many_says_why(claimers, tmp_path):
    assert claimers(2)[1] == [0, 1]
    assert claimers(2)[1] == [2, 3]
    with pytest.raises(RuntimeError, match="5 GPUs asked for, and this machine has 4"):
        gpus.claim(5, 4, tmp_path / "claims")


def test_devices_other_than_a_bare_cuda_are_taken_as_written():
    assert gpus.device_for({"device": "cpu"}) == "cpu"
    assert gpus.device_for({"device": "cuda:3"}) == "cuda:3"
    with pytest.raises(RuntimeError, match="no GPU that CUDA can see"):
        gpus.device_for({"device": "cuda"}, count=0)


def test_placement_counts_the_gpus_its_placed_children_take():
    """Eight one-GPU ranks fill an 8-GPU node and the ninth waits for another (it used to be
    placed there too: "a node with at least one GPU")."""
    sup = Supervisor.__new__(Supervisor)
    sup.spec = ChildSpec(id="model.policy", kind="supervisor",
                         children=[ChildSpec(id=f"learner.{k}", kind="learner_rank", placement={"gpus": 1})
                                   for k in range(9)])
    sup.nodes = {"n1": {"name": "gpu-a", "gpus": 8, "cpus": 64}, "n2": {"name": "cpu-b", "gpus": 0, "cpus": 64}}
    sup.addresses, sup.placed_on = {}, {}
    for child in sup.spec.children[:8]:
        node = sup._pick_node(child)
        assert node == "n1", child.id
        sup.addresses[child.id], sup.placed_on[child.id] = object(), node
    assert sup._pick_node(sup.spec.children[8]) is None
    del sup.addresses["learner.3"]                               # one exits (restarting): its GPU is free again
    assert sup._pick_node(sup.spec.children[3]) == "n1"


def test_a_machine_without_a_gpu_driver_counts_none_without_importing_torch():
    """A CPU-only node's `actorjet join` imported torch (1.5 of its 3.1 CPU-s) to count zero
    GPUs; a runner node never needs torch.  Where a driver is present, torch still counts."""
    code = "import sys; from actorjet.runtime import gpus; print(gpus.gpu_count(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    if any(Path(driver).exists() for driver in gpus.DRIVERS):
        import torch
        assert out.split()[0] == str(torch.cuda.device_count())
    else:
        assert out.split() == ["0", "False"]
