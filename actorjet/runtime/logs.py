"""Per-node log files.

The starter process puts the node's log directory in ``ACTORJET_LOG_DIR`` before it
starts its actor system; actor processes inherit the environment and call ``ensure()``
on their first message (thespian reconfigures logging in each actor process, so a
handler inherited through fork cannot be relied on).  All actors of a node append to
``LOG_DIR/actors.log``, pid on every line; thespian's own log is ``LOG_DIR/thespian.log``.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("actorjet")
_configured_pid = None


def ensure() -> None:
    """Attach this process's file handler once (cheap to call on every message)."""
    global _configured_pid
    if _configured_pid == os.getpid():
        return
    _configured_pid = os.getpid()
    if os.environ.get("ACTORJET_LOG_DIR"):
        configure(Path(os.environ["ACTORJET_LOG_DIR"]))


def _log_thread_death(args) -> None:
    """Any thread that dies of an exception says so in the node's log (tests look for it)."""
    log.critical("uncaught exception in thread %s of pid %d: %s: %s", getattr(args.thread, "name", "?"),
                 os.getpid(), args.exc_type.__name__, args.exc_value,
                 exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def configure(log_dir: Path, level: int = logging.INFO) -> None:
    global _configured_pid
    threading.excepthook = _log_thread_death
    _configured_pid = os.getpid()
    os.environ["ACTORJET_LOG_DIR"] = str(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for handler in list(log.handlers):
        log.removeHandler(handler)
    handler = logging.FileHandler(log_dir / "actors.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
