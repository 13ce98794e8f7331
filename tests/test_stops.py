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
                assert head.status(timeout_s=30)["nodes"], i      # 30 s: a suite's CI worker can be starved
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


def test_a_sigkilled_front_process_takes_its_whole_actor_system_with_it(swarm, network, trees, tmp_path):
    """Issue 51: the front process of a head, a joined node, an outbound node (each on its own
    host: a network namespace) and a research trial's head is SIGKILLed (as the OOM killer
    would): within seconds nothing of it is left (runtime/owner_watch.py), its admin included."""
    import json
    import os
    import signal
    import sys
    import time

    from actorjet.models.prepare import prepare
    from swarm import REPO, wait_until

    head_host, node_host, laptop = (network.host(n) for n in ("head", "node", "laptop"))
    head, port, token = swarm.head(tmp_path / "run", str(trees / "trials.toml"), slots=1, host=head_host)
    door = head.wait_for(r"--outbound (\S+)").group(1)                  # a door, no model
    node, _ = swarm.join(port, token, "member", slots=1, head_host=head_host.ip, host=node_host)
    outbound = swarm.outbound(door, token, "laptop", slots=1, host=laptop)
    trial_dir = tmp_path / "trial"       # a trial's head on the head's host, as the controller starts it
    trial_dir.mkdir()
    (trial_dir / "job.json").write_text(json.dumps(prepare(normalize({"train": {"steps": 10 ** 6}}, "trial"))))
    trial = subprocess.Popen(head_host.prefix + [sys.executable, "-m", "actorjet.research.trial", str(trial_dir)],
                             cwd=REPO, env=swarm.env_of(head_host), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (trial_dir / "head.json").exists(), 120, what="the trial's head")
        wait_until(lambda: len(swarm.host_processes(head_host)) >= 8, 60, what="both heads' actors")
        hosts = {"head and trial head": head_host, "node": node_host, "outbound node": laptop}
        before = {name: len(swarm.host_processes(h)) for name, h in hosts.items()}
        assert before["node"] >= 3 and before["outbound node"] >= 1, before     # node: front, admin, actors
        killed = time.monotonic()
        for pid in (head.popen.pid, node.popen.pid, outbound.popen.pid, trial.pid):
            os.kill(pid, signal.SIGKILL)
        left = lambda: {name: [p.pid for p in swarm.host_processes(h)] for name, h in hosts.items()}  # noqa: E731
        wait_until(lambda: not any(left().values()), 20, interval_s=0.2, what="nothing left on any host")
        print(f"every actor system ended {time.monotonic() - killed:.1f} s after its front process was SIGKILLed "
              f"(processes before: {before})")
        assert not swarm.leftovers()
    finally:
        if trial.poll() is None:
            trial.kill()
        trial.wait(10)


def test_every_process_of_a_head_signalled_at_once_is_gone_within_five_seconds(swarm, trees, tmp_path):
    """``pkill``, a service manager or a container stop sends SIGTERM to every process at once:
    the root supervisor dies with the rest, so the front must not wait out StopTree's 10 s for
    its answer (it took 11.6 s before runtime/head.py stopped waiting on a root that is gone)."""
    import contextlib
    import signal
    import time

    import psutil

    from actorjet.runtime.head import attach_root, status as head_status
    from swarm import REPO, wait_until

    job = (REPO / "agents" / "job.toml").read_text().replace("steps = 150", "steps = 1")
    (tmp_path / "job.toml").write_text(job)
    proc, port, _ = swarm.head(tmp_path / "run", str(REPO / "supervisors" / "default.toml"), slots=1,
                               extra=["--config", str(tmp_path / "job.toml")])
    wait_until(lambda: head_status(*attach_root(port))["training_finished"], 60, what="the job's one step")
    procs = system.system_processes(port) + [psutil.Process(proc.popen.pid)]
    assert len(procs) >= 8, procs           # the front, the admin, the registry, a model's subtree, runners
    started = time.monotonic()
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):     # one that ended by itself (a task worker)
            p.send_signal(signal.SIGTERM)
    while any(system.still_running(p) for p in procs) and time.monotonic() - started < 15:
        proc.popen.poll()                   # the front is this test's child: reap it
        time.sleep(0.05)
    left = [_named(p) for p in procs if system.still_running(p)]
    assert not left and time.monotonic() - started < 5, (left, time.monotonic() - started)


def _named(p) -> str:
    """A process as a failure message shows it: thespian titles an actor's process with its class."""
    import psutil

    try:
        return f"{p.pid} {' '.join(p.cmdline())[:80]}"
    except psutil.Error:
        return str(p.pid)


@pytest.mark.parametrize("ends,code", [("return 3", 3), ("raise SystemExit(143)", 143), ("return None", 0)])
def test_a_front_leaves_with_its_code_and_what_it_printed_but_without_the_teardown(ends, code):
    """runtime/leave.py: what a command printed arrives, its exit code is kept (a SIGTERM
    handler's ``sys.exit(143)`` too), and the interpreter's teardown (the seconds a loaded
    machine spent in torch's finalizers) is skipped."""
    import sys

    program = ("import atexit\nfrom actorjet.runtime.leave import run_then_leave\n"
               "atexit.register(print, 'teardown ran')\n"
               f"def main():\n    print('done', end='')\n    {ends}\n"
               "run_then_leave(main)\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (code, "done"), out
