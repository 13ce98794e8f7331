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


@pytest.fixture(autouse=True)
def no_silent_thread_deaths(tmp_path):
    """Fail any test whose logs show a thread that died of an uncaught exception outside the
    guarded helper (actorjet/runtime/guarded.py): such a thread dies silently in production."""
    yield
    for log in tmp_path.rglob("actors.log"):
        text = log.read_text(errors="replace")
        if "uncaught exception in thread" in text:
            line = next(x for x in text.splitlines() if "uncaught exception in thread" in x)
            pytest.fail(f"{log}: {line}")


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
