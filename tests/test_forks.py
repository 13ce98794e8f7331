"""runtime/forks.py, with children that only sleep (tests/fork_child.py): a child of a server
whose owner dies runs on unless ``term_with_parent`` asked for the parent-death chain (a swarm
node's trials end with its TrialHost).  The research trials forked through it:
tests/test_research.py and tests/test_research_swarm.py."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from swarm import wait_until

HERE = Path(__file__).resolve().parent
OWNER = """
import json, sys, time
from pathlib import Path
from actorjet.runtime.forks import ForkServer
server = ForkServer("fork_child", Path(sys.argv[1]), term_with_parent=sys.argv[2] == "1")
run = Path(sys.argv[1]) / "one"
run.mkdir(parents=True)
child = server.start(run)
print(json.dumps({"server": server.pid, "child": child.pid}), flush=True)
time.sleep(120)
"""


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.parametrize("chained", [True, False])
def test_a_forked_child_ends_with_its_servers_owner_only_when_chained(tmp_path, chained):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "runs"), "1" if chained else "0"],
                             stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    pids = {}
    try:
        pids = json.loads(owner.stdout.readline())
        child = psutil.Process(pids["child"])
        wait_until(lambda: (tmp_path / "runs" / "one" / "trial.log").exists(), 10, what="the child's own log")
        assert os.getsid(child.pid) == child.pid                   # a session of its own (made before its log)
        assert str(tmp_path / "runs") in " ".join(child.cmdline())   # its server's command line names the folder
        owner.kill()                                               # as the OOM killer would
        owner.wait()
        if chained:      # the server gets SIGTERM as its owner dies, the child as the server dies
            wait_until(lambda: gone([pids["server"], pids["child"]]), 10, what="the server and its child to end")
        else:            # the server ends with its pipe; the child runs on (a killed controller's trials)
            wait_until(lambda: gone([pids["server"]]), 10, what="the server to end")
            assert not gone([pids["child"]])
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid in pids.values():
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_a_child_outlives_its_killed_server_and_is_then_judged_by_its_pid(tmp_path, monkeypatch):
    """The server's replies end (killed, or the reading thread ended): a child's status then
    comes from its PID, alive or gone, and the next start brings up a new server."""
    from actorjet.runtime.forks import ForkServer

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    server = ForkServer("fork_child", tmp_path / "runs")
    runs = [tmp_path / "runs" / name for name in ("one", "two")]
    for run in runs:
        run.mkdir(parents=True)
    children = []
    try:
        children.append(server.start(runs[0]))
        first_server = server.pid
        os.kill(first_server, signal.SIGKILL)
        wait_until(lambda: server.server_gone, 10, what="the reading thread to see the server end")
        assert children[0].poll() is None                    # still sleeping: running, as far as anyone knows
        children[0].kill()
        wait_until(lambda: children[0].poll() == 1, 10, what="the child, gone, judged by its PID")
        children.append(server.start(runs[1]))              # a new server for the next child
        assert server.pid not in (None, first_server) and children[1].poll() is None
        with server.changed:                              # what its reading thread leaves if it dies
            server.server_gone = True                     # while the server itself still runs
        stale = server.pid
        children.append(server.start(runs[0]))             # ...and is replaced, not asked in vain
        assert server.pid not in (None, stale)
        wait_until(lambda: gone([stale]), 10, what="the stale server to end")
    finally:
        for child in children:
            child.kill()
        server.close()
