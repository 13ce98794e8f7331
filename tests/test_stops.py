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
