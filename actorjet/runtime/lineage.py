"""Every actor of ours dies with the process that forked it (its parent actor, or the node's
admin for the actors thespian creates itself: the root supervisor, global names), and is gone
at most SIGTERM_EXIT_S after a SIGTERM, whatever its orderly stop is waiting for.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
SIGTERM_EXIT_S = 3.0        # a service manager waits 5 s (the brief's promise) before SIGKILL


def die_with_parent() -> None:
    """Arm Linux's parent-death signal (SIGKILL) for this actor process.

    thespian stops children on an orderly exit only.  A child whose creation was still under
    way when its parent stopped (a runner placed just as the head stopped) never learned of
    its parent and lived on by itself, a system's process nobody could stop: found by starting
    and stopping 30 heads in a row, and the 10 s a stop then waited.  A supervisor that dies
    any other way (SIGKILL) left its children running beside the ones its restart made.  OTP
    links a child to its supervisor; Linux's parent-death signal does the same here."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() == 1:           # the parent was gone before the signal was armed
        os._exit(0)


def term_with_parent() -> None:
    """Arm Linux's parent-death signal as SIGTERM, an orderly stop (a trial stops its head
    cleanly): a swarm node's research trials, and the server they are forked from, end with
    the node's TrialHost (runner/trial_runs.py, runtime/forks.py)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def exit_soon_after_sigterm(on_signal=None) -> None:
    """Keep thespian's SIGTERM handling (an orderly exit: the actor's own stop, its children
    asked to exit) but end the process SIGTERM_EXIT_S later if that has not finished.

    An orderly exit can wait far longer: a server lets requests in flight finish for 10 s, a
    parent waits for children that wait for theirs, a handler may be mid-step.  When ``pkill``
    or a container stop signals every process at once, CI saw four actors and the front still
    running 15 s later.  ``on_signal`` runs first, in the main thread (an actor shortens its
    own grace there).  Call it in the actor's process, after thespian set its handlers."""
    thespians = signal.getsignal(signal.SIGTERM)
    armed = threading.Event()

    def on_sigterm(signum, frame):
        if not armed.is_set():
            armed.set()
            deadline = threading.Timer(SIGTERM_EXIT_S, os._exit, (128 + signal.SIGTERM,))
            deadline.daemon = True
            deadline.start()
            if on_signal is not None:
                on_signal()
        if callable(thespians):
            thespians(signum, frame)
        elif thespians in (signal.SIG_DFL, None):
            os._exit(128 + signal.SIGTERM)

    with contextlib.suppress(ValueError):       # not the main thread: leave the handler as it is
        signal.signal(signal.SIGTERM, on_sigterm)
