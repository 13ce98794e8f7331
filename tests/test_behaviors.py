"""Behavior payloads are verified before anything is unpickled."""
import os
import pickle

import cloudpickle
import pytest

from actorjet.behaviors import BehaviorRejected, load, sign
from actorjet.signing import SECRET_ENV


class _Boom:
    """Unpickling this writes a marker file: proof that a payload was (or was not) unpickled."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_signed_behavior_round_trips():
    payload = sign("secret", "agents.x:behavior", 3, cloudpickle.dumps(lambda task, llm: 0.5))
    assert load(payload, "secret")({}, None) == 0.5


@pytest.mark.parametrize("attack", ["flip a byte", "other key", "raw pickle", "forged version"])
def test_bad_payloads_are_refused_without_being_unpickled(tmp_path, attack):
    marker = tmp_path / "unpickled"
    blob = pickle.dumps(_Boom(str(marker)))
    payload = sign("secret", "b", 1, blob)
    if attack == "flip a byte":
        payload["blob"] = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    elif attack == "other key":
        payload = sign("another-cluster", "b", 1, blob)
    elif attack == "raw pickle":
        payload = blob
    else:
        payload["version"] = 2
    with pytest.raises(BehaviorRejected) as err:
        load(payload, "secret")
    assert str(err.value)
    assert not marker.exists()
    load(sign("secret", "b", 1, blob), "secret")       # the control: a valid one does unpickle
    assert marker.exists()
    os.remove(marker)


def test_a_node_without_a_secret_refuses_everything(monkeypatch):
    monkeypatch.delenv("ACTORJET_TOKEN", raising=False)
    with pytest.raises(BehaviorRejected, match="no cluster secret"):
        load(sign("s", "b", 1, cloudpickle.dumps(len)))


# -- versions kept in the run directory ------------------------------------------------------

def test_store_keeps_versions_across_restarts_and_knows_the_previous_one(tmp_path):
    from actorjet.registry.behavior_store import BehaviorStore

    store = BehaviorStore(tmp_path)
    v1 = store.add("arith", b"one", "a.py:f")
    store.activate("arith", v1)
    v2 = store.add("arith", b"two", "b.py:f")
    store.activate("arith", v2)
    v3 = store.add("arith", b"three", "c.py:f")
    store.mark("arith", v3, "refused", "canary raised")
    again = BehaviorStore(tmp_path)                   # a restarted registry
    assert (v1, v2, v3) == (1, 2, 3)
    assert again.current("arith") == 2 and again.previous("arith") == 1
    assert again.blob("arith", 1) == b"one"
    assert [v["state"] for v in again.index("arith")["versions"]] == ["retired", "active", "refused"]
    with pytest.raises(ValueError):
        store.add("../escape", b"x", "")


def test_task_source_serves_the_stored_version_unless_the_config_changed(tmp_path):
    from actorjet.registry.behavior_store import BehaviorStore
    from actorjet.registry.task_source import TaskSource

    cfg = {"name": "arithmetic", "source": "agents.arithmetic", "behavior": "agents.arithmetic:behavior"}
    store = BehaviorStore(tmp_path)
    first = TaskSource(cfg, 0, "secret", store)
    assert first.version == 1
    upgraded = store.add("arithmetic", cloudpickle.dumps(lambda task, llm: 0.25), "upgrade")
    store.activate("arithmetic", upgraded)
    restarted = TaskSource(cfg, 0, "secret", store)
    assert restarted.version == 2 and load(restarted.payload, "secret")({}, None) == 0.25
    changed = TaskSource(dict(cfg, behavior="agents.arithmetic_v2:behavior"), 0, "secret", store)
    assert changed.version == 3 and store.current("arithmetic") == 3


def test_a_runner_reports_code_that_fails_to_unpickle_instead_of_crashing(monkeypatch):
    from actorjet.runner.episode import load_behavior

    monkeypatch.setenv("ACTORJET_TOKEN", "s")      # the secret a runner's node was joined with

    class NeedsAMissingModule:
        def __reduce__(self):
            return (__import__, ("module_only_on_the_uploaders_machine",))

    fn, error, tb = load_behavior(sign("s", "b", 2, pickle.dumps(NeedsAMissingModule())))
    assert fn is None and "could not load: ModuleNotFoundError" in error and "Traceback" in tb
    fn, error, _ = load_behavior(sign("other", "b", 2, b"x"))
    assert fn is None and error.startswith("refused: bad signature")


def test_the_runner_core_runs_leases_on_their_version_and_gives_up_on_hung_ones(monkeypatch):
    """runner/core.py, shared by the thespian runner and the outbound one."""
    import time

    from actorjet.runner.core import RunnerCore, Threads

    monkeypatch.setenv(SECRET_ENV, "s")
    core = RunnerCore(Threads(4))
    assert core.install(sign("s", "t", 1, cloudpickle.dumps(lambda task, llm: task["x"]))) == ("", "")
    assert core.install(sign("s", "t", 2, cloudpickle.dumps(lambda task, llm: __import__("time").sleep(1.5)))) == ("", "")
    assert core.install(sign("other", "t", 3, b"x"))[0].startswith("refused")     # v2 stays current
    assert core.current == {"t": 2}

    def lease(lid, version, timeout_s=30.0):
        return {"lease_id": lid, "behavior": "t", "version": version, "task_name": "t", "task": {"x": 0.75},
                "urls": {"m": "http://unused"}, "timeout_s": timeout_s,
                "episodes": [{"episode_id": f"{lid}-{k}", "api_key": "k"} for k in range(2)]}

    assert core.start(lease("old", 1)) is None                                   # v1 still runs its leases
    assert core.start(lease("hangs", 2, timeout_s=0.3)) is None
    refused = core.start(lease("gone", 9))
    assert [r["error"] for r in refused] == ["behavior t v9 could not be loaded here"] * 2
    done: dict = {}
    deadline = time.monotonic() + 10
    while len(done) < 2 and time.monotonic() < deadline:
        done.update({lease["lease_id"]: results for lease, results in core.finished()})
        time.sleep(0.02)
    assert [r["reward"] for r in done["old"]] == [0.75, 0.75]
    assert [r["error"] for r in done["hangs"]] == ["timeout: still running after 0.3 s"] * 2
    assert len(core.still_hung()) == 2 and core.busy() == 0 and not core.lease_ids()   # until the sleeps end
    deadline = time.monotonic() + 10
    while core.still_hung() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert core.still_hung() == []
    core.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_canary_runs_through_the_runner_core_under_its_isolation_without_becoming_current(monkeypatch, isolation):
    """Canaries used to bypass the core (their own thread pool, no process isolation)."""
    import time

    from actorjet.runner.core import Processes, RunnerCore, Threads

    monkeypatch.setenv(SECRET_ENV, "s")
    core = RunnerCore(Threads(2) if isolation == "thread" else Processes(2))
    try:
        assert core.install(sign("s", "t", 1, cloudpickle.dumps(lambda task, llm: 0.0))) == ("", "")
        canary = sign("s", "t", 2, cloudpickle.dumps(lambda task, llm: task["x"]))
        lease = {"group_id": "canary_2_1", "task_name": "t", "tasks": [{"x": 0.25}, {"x": 0.5}],
                 "urls": {"m": "http://unused"}, "episodes": [{"episode_id": f"c-{k}", "api_key": "k"} for k in range(2)]}
        assert core.start_canary(canary, lease) == ("", "")
        assert core.start_canary(sign("other", "t", 3, b"x"), dict(lease, group_id="bad"))[0].startswith("refused")
        deadline, done = time.monotonic() + 60, []
        while not done and time.monotonic() < deadline:
            done = core.finished_canaries()
            time.sleep(0.02)
        [(group_id, payload, results)] = done
        assert group_id == "canary_2_1" and payload["version"] == 2 and [r["reward"] for r in results] == [0.25, 0.5]
        assert core.current == {"t": 1} and core.busy() == 0          # the canary's version is not current
    finally:
        core.close()


def test_process_isolation_restarts_a_task_worker_not_the_runner(monkeypatch):
    """runner/core.py's Processes strategy: hung episodes and memory past task_memory_mb
    restart that task's worker; the runner's own threads stay free."""
    import time

    from actorjet.runner.core import Processes, RunnerCore

    monkeypatch.setenv(SECRET_ENV, "s")
    core = RunnerCore(Processes(4))
    core.install(sign("s", "t", 1, cloudpickle.dumps(lambda task, llm: __import__("time").sleep(60))))
    lease = {"lease_id": "L", "behavior": "t", "version": 1, "task_name": "t", "task": {}, "urls": {"m": "http://unused"},
             "timeout_s": 0.5, "episodes": [{"episode_id": f"e{k}", "api_key": "k"} for k in range(2)]}
    assert core.start(lease) is None
    done = []
    deadline = time.monotonic() + 20
    while not done and time.monotonic() < deadline:
        done = core.finished()
        time.sleep(0.05)
    assert [r["error"] for r in done[0][1]] == ["timeout: still running after 0.5 s"] * 2
    assert len(core.still_hung()) == 2
    assert core.isolation.relieve(core.still_hung(), limit=2) == []       # none holds the runner's threads
    deadline = time.monotonic() + 10
    while core.still_hung() and time.monotonic() < deadline:              # the worker's futures fail
        time.sleep(0.05)
    assert core.still_hung() == []
    assert core.start(dict(lease, lease_id="M", timeout_s=30)) is None     # a fresh worker for the task
    deadline = time.monotonic() + 20
    while core.isolation.workers["t"].rss_mb() == 0 and time.monotonic() < deadline:   # it starts after a back-off
        time.sleep(0.05)
    restarted = core.isolation.restart_over(0.0)                           # every worker is over 0 MB
    assert [name for name, _ in restarted] == ["t"] and restarted[0][1] > 0
    core.close()


def test_a_runner_whose_concurrency_is_below_the_group_size_still_takes_a_group_when_idle():
    """runner_concurrency = 5 with group_size = 8 left every runner asking for 0 groups, for
    ever ("starting" in status; found by bench/control_plane.py --kind thespian)."""
    from actorjet.runner.core import groups_to_take

    assert groups_to_take(5, 0, 8) == 1            # idle: one group, its last 3 episodes wait for a thread
    assert groups_to_take(5, 3, 8) == 0            # busy: no more until it is done
    assert groups_to_take(64, 0, 8) == 8 and groups_to_take(64, 60, 8) == 0 and groups_to_take(64, 8, 8) == 7


LONG_TMPDIR_EPISODE = """
import cloudpickle, os, sys, tempfile, time
from actorjet.behaviors import SECRET_ENV, sign
from actorjet.runner.core import Processes, RunnerCore
os.environ[SECRET_ENV] = "s"
core = RunnerCore(Processes(1))
core.install(sign("s", "t", 1, cloudpickle.dumps(lambda task, llm: 1.0)))
lease = {"lease_id": "L", "behavior": "t", "version": 1, "task_name": "t", "task": {}, "urls": {"m": "http://x"},
         "timeout_s": 60, "episodes": [{"episode_id": "e0", "api_key": "k"}]}
core.start(lease)
deadline, done = time.monotonic() + 60, []
while not done and time.monotonic() < deadline:
    done = core.finished()
    time.sleep(0.05)
core.close()
print(done[0][1][0] if done else "no result", tempfile.gettempdir() == os.environ["TMPDIR"])
"""


def test_process_isolation_runs_under_a_tmpdir_too_long_for_a_unix_socket(tmp_path):
    """The task workers' fork server listens on a unix socket under TMPDIR; past 107 bytes
    every worker start failed ("AF_UNIX path too long") and the runner crashed forever (found
    by bench/cocktail.py --smoke under pytest-xdist's long temp paths).  The episode runs, and
    agent code still sees its own TMPDIR."""
    import subprocess
    import sys

    long_dir = tmp_path / ("t" * 60) / ("m" * 40)
    long_dir.mkdir(parents=True)
    assert len(str(long_dir)) > 107
    out = subprocess.run([sys.executable, "-c", LONG_TMPDIR_EPISODE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(long_dir)})
    assert out.returncode == 0 and "'reward': 1.0" in out.stdout and out.stdout.strip().endswith("True"), \
        out.stdout[-2000:] + out.stderr[-2000:]
