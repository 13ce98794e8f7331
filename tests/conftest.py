import os
import sys
from pathlib import Path

# Three xdist workers share two cores (setup.cfg) beside the swarms they start.  A worker that
# runs a model itself (packing, gradients, engines in-process) with torch's default two OpenMP
# threads spins them against everyone else: tests/test_context.py took 152 CPU-s that way and
# 42 with one thread each (serving/threads.py measured the same for actor processes).  Idle
# OpenMP threads sleep (read when torch loads, so before it), and one thread is the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import actorjet  # noqa: E402,F401  - sets thespian's convention timings before thespian loads

from swarm import Swarm  # noqa: E402

TREES = Path(__file__).resolve().parent / "trees"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test, so a fixture can tell that its test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


def _tell_if_failed(request, swarm: Swarm) -> None:
    """CI shows a failure's report and little else: what the swarm said goes with it, once,
    before anything of it is stopped (the network fixture stops the swarm before this one)."""
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and not swarm.told:
        swarm.told = True
        print(swarm.post_mortem())


@pytest.fixture
def swarm(tmp_path, request):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        _tell_if_failed(request, s)
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
def network(swarm, request):
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
        _tell_if_failed(request, swarm)
        swarm.cleanup()
        net.close()


def pytest_configure(config):
    """Byte-compile the repository's Python once, in the controller, before any worker starts.

    An editable install compiles nothing, and where the environment sets
    PYTHONDONTWRITEBYTECODE (this machine's image does) no process ever writes a .pyc: each
    of the hundreds of heads, nodes, trials, CLI commands and benches the suite starts
    compiled ActorJet's modules from source again, ~0.4 CPU-s per process that imports a
    head's modules (3-5% of a swarm test's CPU, measured on test_research and test_docs).
    compileall writes only what is stale; __pycache__ is ignored by git."""
    if hasattr(config, "workerinput"):
        return                  # an xdist worker: the controller has done it
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in ("actorjet", "agents", "tests", "bench"):
        compileall.compile_dir(root / folder, quiet=2)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long(minutes=N)`` start first, the longest first.  xdist hands tests to
    its workers in this order, round robin at the start, and the five-minute soak handed out
    near the end (test_soak.py sorts late) was a suite that waited minutes for it with its
    other workers idle.

    A long test without a timeout of its own gets 600 s instead of setup.cfg's 300: three
    workers share two cores, so a test of N minutes alone takes ~1.5 N in the suite, and up to
    3 N on a slower 2-core machine (test_team's 3-minute test took 258 s of its 300 on one)."""
    def minutes(item) -> float:
        mark = item.get_closest_marker("long")
        return mark.kwargs.get("minutes", 1) if mark is not None else 0
    items.sort(key=lambda item: -minutes(item))
    for item in items:
        if minutes(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
