import fcntl
import os
import sys
import time
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
def alone_when_marked(request, tmp_path_factory):
    """The suite runs on two xdist workers (setup.cfg): most tests leave a core idle while they
    wait on their swarm, so two at a time take ~2/3 of the time, and every learning margin was
    measured beside a busy process.  A test that *measures* the machine (``@pytest.mark.alone``:
    the soak's step rates and disk high-water marks) runs with nothing beside it: it takes
    the lock exclusively, every other test shares it, and a waiting exclusive taker holds
    new shared ones back (``alone.want.*``) so it is not starved."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        yield
        return
    root = tmp_path_factory.getbasetemp().parent          # shared by this session's workers
    with open(root / "alone.lock", "a+") as lock:
        if request.node.get_closest_marker("alone"):
            want = root / f"alone.want.{worker}"
            want.touch()
            fcntl.flock(lock, fcntl.LOCK_EX)
            want.unlink()
        else:
            while list(root.glob("alone.want.*")):
                time.sleep(0.2)
            fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
