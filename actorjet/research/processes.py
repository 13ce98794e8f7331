"""Stopping a study's trial processes, and only those.

A trial runs in its own session (``start_new_session``), so it leads a process group that
holds it and the head it embeds; stopping a trial ends with a SIGKILL of that group, because
a head's actor system can outlive the trial process (seen: one training on for two hours).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from actorjet.runtime.system import kill_group, kill_head_of

STOP_GRACE_S = 30.0


def stop(proc: subprocess.Popen, run_dir: str) -> None:
    proc.terminate()             # the trial stops its head cleanly on SIGTERM
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    ended(proc, run_dir)


def ended(proc: subprocess.Popen, run_dir: str) -> None:
    """Nothing of a trial that ended may outlive it (seen: a study's actor system training on
    for two hours after its trial had exited): its group, and its head's actor system, which
    runs in a session of its own."""
    kill_group(proc.pid)
    proc.wait()
    kill_head_of(run_dir)


def stop_pid(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        if "actorjet.research.trial" not in " ".join(proc.cmdline()):
            return                   # the PID was reused by something that is not ours
        proc.terminate()
        proc.wait(STOP_GRACE_S)
    except (psutil.TimeoutExpired, psutil.NoSuchProcess):
        pass        # gone or stuck; its group may live on (a PID still used as a group id is not reused)
    except psutil.Error:
        return
    kill_group(pid)


def strays(trials_folder: Path) -> list[int]:
    """PIDs of trial processes (and the heads forked from them) whose command line names a
    run directory in ``trials_folder``: this study's, whatever its registry recorded."""
    import psutil

    folder, out = str(Path(trials_folder).resolve()) + os.sep, []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "actorjet.research.trial" in cmd and folder in cmd and p.pid != os.getpid():
            out.append(p.pid)
    return out
