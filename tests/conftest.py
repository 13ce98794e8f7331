import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import actorjet  # noqa: E402,F401  - sets thespian's convention timings before thespian loads

from swarm import Swarm  # noqa: E402

TREES = Path(__file__).resolve().parent / "trees"


@pytest.fixture
def swarm(tmp_path):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def trees():
    return TREES


@pytest.fixture
def network(swarm):
    """Separate hosts as network namespaces on a private bridge (tests/hosts.py).  The swarm's
    processes stop before the network goes: without it their shutdown hangs on dead links."""
    import hosts

    why = hosts.unavailable()
    if why is not None:
        print(f"SKIP multi-host test: {why}")
        pytest.skip(why)
    net = hosts.Network()
    try:
        yield net
    finally:
        swarm.cleanup()
        net.close()
