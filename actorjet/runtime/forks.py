"""Processes forked from one server process that has already imported what they need.

A research trial is a head of its own, and started as ``python -m ...`` each one first
imported torch, transformers and its head's actor kinds (~4 CPU-s and ~4.5 s on a 2-core
machine).  A ``ForkServer`` starts ``python -m MODULE FOLDER/`` once; MODULE calls ``serve``
with what to import before forking (``preload``) and what each child runs (``run``).  The
protocol, one JSON line each way:

    client → server    per child:                              {"run_dir": RUN_DIR}
    server → client    once it is forked:                      {"run_dir": RUN_DIR, "pid": PID}
                       when it has exited (reaped there):      {"pid": PID, "code": EXIT STATUS}

A child leads a session of its own (as ``start_new_session`` gave it), reads nothing and writes
RUN_DIR/trial.log.  The server imports, never runs a torch op (a forked OpenMP pool deadlocks:
models/prepare.py), and each child is forked from the server as it was after its imports, so
no child sees another's state.  The server's command line names FOLDER, and its children
inherit it: research/processes.py finds a study's trials by it.  The server exits when its
client closes the pipe or dies (end of input) and on SIGTERM.  Its children run on, unless
``term_with_parent`` (a swarm node's trials: they end with the node's TrialHost, through the
server) arms Linux's parent-death signal in both.

Not multiprocessing's "forkserver" (which the runner's task workers use, runner/worker.py):
its server's command line does not name the folder, and a process has one such server with
one preload list.
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
from typing import Callable

import psutil

from actorjet.runtime import heap, lineage, system
from actorjet.runtime.leave import run_then_leave

START_S = 120.0      # the first child waits for the server's imports (seconds on a loaded machine)
TERM_WITH_PARENT = "--term-with-parent"


# -- the server ----------------------------------------------------------------------------------
def serve(argv: list[str], preload: Callable[[str], None], run: Callable[[str], int | None]) -> int:
    """The server's loop (``argv``: FOLDER/ [--term-with-parent], as ForkServer starts it);
    ``preload(run_dir)`` is called before each fork, ``run(run_dir)`` in the child."""
    term_with_parent = TERM_WITH_PARENT in argv
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # before torch loads (runtime/system.py)
    replies = os.fdopen(os.dup(1), "w", buffering=1)        # the protocol; fd 1 itself: the log
    os.dup2(2, 1)
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
            return 0                 # the client is gone: its children run on (see the docstring)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            run_dir = json.loads(line)["run_dir"]
            try:
                preload(run_dir)         # what this child needs (a model class): the next has it already
            except Exception:  # noqa: BLE001 - the child itself reports what is wrong with its files
                pass
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_child(run_dir, replies.fileno(), run, term_with_parent)
            running.add(pid)
            replies.write(json.dumps({"run_dir": run_dir, "pid": pid}) + "\n")


def _become_child(run_dir: str, replies_fd: int, run: Callable[[str], int | None], term_with_parent: bool) -> None:
    """In the forked child: a session, input and output of its own, then ``run``."""
    try:
        if term_with_parent:
            lineage.term_with_parent()
        os.close(replies_fd)           # the client's pipe is the server's alone
        os.setsid()
        log = os.open(Path(run_dir) / "trial.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        heap.freeze_inherited()        # the server's imports are never garbage (runtime/heap.py)
        run_then_leave(run, run_dir)
    except BaseException:              # as the interpreter would: the error, in trial.log
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


# -- the client's end ----------------------------------------------------------------------------
class ForkServer:
    """Starts ``python -m MODULE FOLDER/`` on first use and hands out children that answer like
    ``subprocess.Popen``; its log is FOLDER/../trial-server.log."""

    def __init__(self, module: str, folder: Path, term_with_parent: bool = False):
        self.module, self.term_with_parent = module, term_with_parent
        self.folder = Path(folder).resolve()
        self.proc: subprocess.Popen | None = None
        self.codes: dict[int, int] = {}
        self.replies: queue.Queue = queue.Queue()
        self.changed = threading.Condition()
        self.server_gone = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, run_dir: Path) -> "Forked":
        if self.proc is not None and (self.server_gone or self.proc.poll() is not None):
            self.close()           # dead, or its replies stopped: a new server (children run on)
        if self.proc is None:
            self._spawn()
        self.proc.stdin.write(json.dumps({"run_dir": str(run_dir)}) + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.replies.get(timeout=START_S)
        except queue.Empty:
            reply = None
        if reply is None:
            raise RuntimeError(f"{self.module} did not start {run_dir} (see {self.folder.parent / 'trial-server.log'})")
        return Forked(self, reply["pid"])

    def _spawn(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.replies, self.server_gone = queue.Queue(), False
        with open(self.folder.parent / "trial-server.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, f"{self.folder}{os.sep}", *[TERM_WITH_PARENT] * self.term_with_parent],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                preexec_fn=lineage.term_with_parent if self.term_with_parent else None)
        threading.Thread(target=self._read, args=(self.proc, self.replies), daemon=True,
                         name="fork-server").start()

    def _read(self, proc: subprocess.Popen, replies: queue.Queue) -> None:
        """The server's replies, until it ends.  However this thread ends, the server counts as
        gone: a waiting start fails at once, and children are then judged by their PIDs."""
        try:
            for line in proc.stdout:
                msg = json.loads(line)
                if "code" in msg:
                    with self.changed:
                        self.codes[msg["pid"]] = msg["code"]
                        self.changed.notify_all()
                else:
                    replies.put(msg)
        finally:
            replies.put(None)
            with self.changed:
                self.server_gone = True
                self.changed.notify_all()

    def code(self, pid: int) -> int | None:
        """A child's exit status, None while it runs.  Had the server died first (nobody kills
        it but a resumed controller), a child's status is lost with it: 1 once it is gone."""
        with self.changed:
            if pid in self.codes:
                return self.codes[pid]
            if not self.server_gone:
                return None
        try:
            return None if system.still_running(psutil.Process(pid)) else 1
        except psutil.NoSuchProcess:
            return 1

    def close(self) -> None:
        """No more children: the server exits (the ones it started are the client's to stop)."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class Forked:
    """One child of a ForkServer, with the part of ``subprocess.Popen`` its users need."""

    def __init__(self, server: ForkServer, pid: int):
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
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
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
