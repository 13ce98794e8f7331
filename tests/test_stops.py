"""Thirty heads started and stopped in a row (issue 34: an admin that sometimes ignored
thespian's shutdown request left a system behind, or a stop that waited 10 s for it).  Each
stop must be answered by the admin: nothing killed by the reap step, no process left on the
port, no "No response to Admin shutdown" in thespian's log.  And a system whose admin exits while
a stop looks for its processes is a system with nothing left to stop."""
import subprocess

import pytest

from actorjet.config import normalize
from actorjet.runtime import system
from actorjet.runtime.head import Head
from actorjet.runtime.tree_spec import load_tree

pytestmark = pytest.mark.slow

HEADS = 30


def test_thirty_heads_stop_in_a_row_each_answered_and_leaving_nothing(tmp_path, trees):
    tree = load_tree(trees / "nodes.toml")
    for i in range(HEADS):
        port = system.free_port()     # below the ephemeral range: see its docstring
        head = Head(tmp_path / f"run{i}", tree, normalize({}), port=port, slots=1)
        head.start()
        try:
            if i % 2:              # stopped while its runner is being created, or once it answers
                assert head.status()["nodes"], i
            procs = system.system_processes(port)
            assert len(procs) >= 3, (i, procs)            # admin, registry, runners' supervisor
        finally:
            head.stop()
        assert not any("killed" in note for note in head.notes), (i, head.notes)
        assert not [p for p in procs if system.still_running(p)], i
        assert not system.port_in_use("127.0.0.1", port), i
        log = tmp_path / f"run{i}" / "logs" / "head" / "thespian.log"
        text = log.read_text() if log.exists() else ""
        assert "No response to Admin shutdown" not in text and "Could not send shutdown" not in text, (i, text[-800:])


def test_a_system_whose_admin_exits_mid_scan_has_no_processes_left(monkeypatch):
    """The admin can exit between the port scan and the session lookup (seen in CI at a
    test's teardown): that is a system with nothing left to stop, not an error."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    monkeypatch.setattr(system, "admin_pid", lambda port: gone.pid)
    assert system.system_processes(12345) == []


def test_a_sigkilled_front_process_takes_its_whole_actor_system_with_it(swarm, trees, tmp_path):
    """Issue 51: the front process of a head, a joined node, an outbound node and a research
    trial's head is SIGKILLed (as the OOM killer would): within seconds nothing of it is left
    (runtime/owner_watch.py), its admin included, and its port is free."""
    import json
    import os
    import signal
    import sys
    import time

    from actorjet.models.prepare import prepare
    from swarm import REPO, wait_until

    head, port, token = swarm.head(tmp_path / "run", str(trees / "trials.toml"), slots=1)   # a door, no model
    door = head.wait_for(r"--outbound (\S+)").group(1)
    node, node_port = swarm.join(port, token, "member", slots=1)
    outbound = swarm.outbound(door, token, "laptop", slots=1)
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    job = prepare(normalize({"train": {"steps": 10 ** 6}}, "trial"))
    (trial_dir / "job.json").write_text(json.dumps(job))
    trial = subprocess.Popen([sys.executable, "-m", "actorjet.research.trial", str(trial_dir)], cwd=REPO,
                             env=swarm.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info = wait_until(lambda: (trial_dir / "head.json").exists() and json.loads((trial_dir / "head.json").read_text()),
                          120, what="the trial's head")
        trial_port = info["port"]
        wait_until(lambda: len(system.system_processes(trial_port)) >= 3, 60, what="the trial's actors")
        systems = {"head": port, "node": node_port, "trial head": trial_port}
        procs = {name: system.system_processes(p) for name, p in systems.items()}
        assert all(len(ps) >= 2 for ps in procs.values()), procs            # an admin and its actors each
        fronts = {"head": head.popen.pid, "node": node.popen.pid, "outbound node": outbound.popen.pid,
                  "trial head": trial.pid}
        killed = time.monotonic()
        for pid in fronts.values():
            os.kill(pid, signal.SIGKILL)
        left = lambda: {name: [p.pid for p in ps if system.still_running(p)] for name, ps in procs.items()}  # noqa: E731
        wait_until(lambda: not any(left().values()), 15, interval_s=0.2, what="every actor system to end")
        gone_s = time.monotonic() - killed
        assert not any(system.port_in_use("127.0.0.1", p) for p in systems.values())
        assert outbound.popen.wait(5) == -signal.SIGKILL
        wait_until(lambda: not swarm.leftovers(), 15, interval_s=0.2, what="the watchers to exit too")
        print(f"every actor system ended {gone_s:.1f} s after its front process was SIGKILLed")
    finally:
        if trial.poll() is None:
            trial.kill()
        trial.wait(10)
