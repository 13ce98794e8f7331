"""A study's trials, forked from one process that has already imported what a trial needs.

Each trial is a head of its own (research/trial.py).  Started as ``python -m
actorjet.research.trial``, every trial paid for importing torch, transformers and its head's
actor kinds before its first step: ~4 CPU-s and ~4.5 s of wall time a trial on this 2-core
machine, ~80% of a 4-step trial (a smoke study's trial took 4.7-5.1 CPU-s in all, ~1 CPU-s
forked from here).  A study's controller (launchers.py ``LocalTrials``) starts this server
once and asks it for each trial:

    controller → server    one JSON line per trial:          {"run_dir": RUN_DIR}
    server → controller    once it is forked:                {"run_dir": RUN_DIR, "pid": PID}
                           when it has exited (reaped here): {"pid": PID, "code": EXIT STATUS}

The server imports, never runs a torch op (a forked OpenMP pool deadlocks: models/prepare.py),
and each trial is forked from the server as it was after its imports, so no trial sees
another's state.  A trial leads a session of its own (as ``start_new_session`` gave it) and
writes RUN_DIR/trial.log.  The server's command line names the study's trials folder, which
is how research/processes.py finds a study's trial processes (they inherit it).  It exits when
its controller closes the pipe or dies (end of input) and on SIGTERM; trials it started run on,
as they did as children of a killed controller, until a resumed controller stops them.

Not multiprocessing's "forkserver" (which the runner's task workers use, runner/worker.py):
its server's command line does not name the study, which is how a resumed controller finds
the trials of one that was killed, and a process has one such server with one preload list.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

START_S = 120.0      # the first trial waits for the server's imports (seconds on a loaded machine)


# -- the server ----------------------------------------------------------------------------------
def serve(folder: str) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # before torch loads (runtime/system.py)
    replies = os.fdopen(os.dup(1), "w", buffering=1)        # the protocol; fd 1 itself: the log
    os.dup2(2, 1)
    from actorjet.research import trial

    running: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.2 if running else 1.0)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                running.clear()
                break
            if pid == 0:
                break
            running.discard(pid)
            replies.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
        if not readable:
            continue
        data = os.read(0, 65536)
        if not data:
            return 0                 # the controller is gone: its trials run on (see the docstring)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            run_dir = json.loads(line)["run_dir"]
            try:
                trial.preload(run_dir)   # this trial's model class too: the next trial has it already
            except Exception:  # noqa: BLE001 - the trial itself reports what is wrong with its files
                pass
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_trial(run_dir, replies.fileno())
            running.add(pid)
            replies.write(json.dumps({"run_dir": run_dir, "pid": pid}) + "\n")


def _become_trial(run_dir: str, replies_fd: int) -> None:
    """In the forked child: a session, input and output of its own, then the trial."""
    try:
        os.close(replies_fd)           # the controller's pipe is the server's alone
        os.setsid()
        log = os.open(Path(run_dir) / "trial.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from actorjet.research import trial
        from actorjet.runtime import heap
        from actorjet.runtime.leave import run_then_leave

        heap.freeze_inherited()        # the server's imports are never garbage (runtime/heap.py)
        run_then_leave(trial.main, run_dir)
    except BaseException:              # as the interpreter would: the error, in trial.log
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


# -- the controller's end ------------------------------------------------------------------------
class TrialServer:
    """Starts the server on first use and hands out trials that answer like ``subprocess.Popen``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder).resolve()
        self.proc: subprocess.Popen | None = None
        self.codes: dict[int, int] = {}
        self.replies: queue.Queue = queue.Queue()
        self.changed = threading.Condition()
        self.server_gone = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, run_dir: Path) -> "ForkedTrial":
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        self.proc.stdin.write(json.dumps({"run_dir": str(run_dir)}) + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.replies.get(timeout=START_S)
        except queue.Empty:
            reply = None
        if reply is None:
            raise RuntimeError(f"the trial server did not start {run_dir} (see {self.folder.parent / 'trial-server.log'})")
        return ForkedTrial(self, reply["pid"])

    def _spawn(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.replies, self.server_gone = queue.Queue(), False
        with open(self.folder.parent / "trial-server.log", "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "actorjet.research.trial_server", f"{self.folder}{os.sep}"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                         start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc, self.replies), daemon=True,
                         name="trial-server").start()

    def _read(self, proc: subprocess.Popen, replies: queue.Queue) -> None:
        for line in proc.stdout:
            msg = json.loads(line)
            if "code" in msg:
                with self.changed:
                    self.codes[msg["pid"]] = msg["code"]
                    self.changed.notify_all()
            else:
                replies.put(msg)
        replies.put(None)
        with self.changed:
            self.server_gone = True
            self.changed.notify_all()

    def code(self, pid: int) -> int | None:
        """A trial's exit status, None while it runs.  Had the server died first (nobody kills
        it but a resumed controller), a trial's status is lost with it: 1 once it is gone."""
        with self.changed:
            if pid in self.codes:
                return self.codes[pid]
            if not self.server_gone:
                return None
        import psutil

        try:
            return None if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else 1
        except psutil.Error:
            return 1

    def close(self) -> None:
        """No more trials: the server exits (the trials it started are the controller's to stop)."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class ForkedTrial:
    """One trial of a TrialServer, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, server: TrialServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout)
            with self.server.changed:
                self.server.changed.wait(0.5 if left is None else min(0.5, left))
        return self.returncode

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
