"""An actor system ends with the process that started it, however that process dies.

thespian's admin daemonizes: its parent is PID 1 and it leads a session of its own, so a
front process (``actorjet start``, ``actorjet join``, the quickstart, a research trial's head)
that is SIGKILLed — by the OOM killer, say — left the admin and every actor running, still
listed as alive by the head, and the admin did not end on SIGTERM either.  A parent-death
signal cannot help (the admin's parent is not the front), and thespian's admin is not ours
to change.  So ``start_actor_system`` starts this small watcher beside it, in a session of
its own (outside the system's, so a stop never counts it among the system's processes):

    every WATCH_S:  the admin is gone            → the system stopped: exit
                    the owner is gone (or a new  → SIGTERM every process of the admin's
                    process holds its PID)         session, SIGKILL whatever is left after
                                                   STOP_S (the admin ignores SIGTERM), exit

By signal, not through thespian: a thespian handle on a port whose admin has just died
starts a new admin there (seen once in the suite: a power-cut test killed the admin as the
watcher came to stop it, and the watcher's new system stayed behind).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

WATCH_S = 0.5
STOP_S = 5.0


def start(port: int, admin_pid: int) -> subprocess.Popen | None:
    """Watch the admin on ``port`` on behalf of this process (its owner)."""
    if admin_pid is None:
        return None
    return subprocess.Popen([sys.executable, "-m", "actorjet.runtime.owner_watch", str(os.getpid()),
                             str(started(os.getpid())), str(port), str(admin_pid)],
                            start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def started(pid: int) -> float:
    """When ``pid`` started (0.0: no such process): with the PID, what names a process for good."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def alive(pid: int, started: float) -> bool:
    """``pid`` is still the process that was started at ``started`` (not a reused PID)."""
    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(owner: int, owner_started: float, port: int, admin: int) -> str:
    """Block until the system or its owner ends; returns what happened."""
    admin_started = started(admin)
    while True:
        if not alive(admin, admin_started):
            return "the actor system stopped"
        if not alive(owner, owner_started):
            stop_session(admin, admin_started)
            return f"the owner (pid {owner}) died: its actor system on port {port} was stopped"
        time.sleep(WATCH_S)


def stop_session(admin: int, admin_started: float) -> None:
    """SIGTERM the admin's session (the admin and every actor forked from it), then SIGKILL
    what is still there after STOP_S (runtime/system.py ``reap``: a zombie counts as gone)."""
    from actorjet.runtime import system      # (it starts this watcher: imported only to stop)

    if not alive(admin, admin_started):
        return
    try:
        sid = os.getsid(admin)
    except ProcessLookupError:
        return
    procs = [p for p in system.session_processes(sid) if p.pid != os.getpid()]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    system.reap(procs, STOP_S)


if __name__ == "__main__":
    owner, owner_started, port, admin = sys.argv[1:5]
    watch(int(owner), float(owner_started), int(port), int(admin))
