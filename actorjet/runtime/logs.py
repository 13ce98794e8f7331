"""Per-node log files.

The starter process puts the node's log directory in ``ACTORJET_LOG_DIR`` before it
starts its actor system; actor processes inherit the environment and call ``ensure()``
on their first message (thespian reconfigures logging in each actor process, so a
handler inherited through fork cannot be relied on).  All actors of a node append to
``LOG_DIR/actors.log``, pid on every line; thespian's own log is ``LOG_DIR/thespian.log``.

**Rotation by size**, across processes: when ``actors.log`` passes ``MAX_BYTES`` the process
that notices (under a lock file, re-checking the size, since another may have just done it)
renames it to ``actors.log.1`` (``.1`` to ``.2`` …, ``BACKUPS`` kept) and every process
reopens the path when it sees that the file it writes is no longer the one there (the
stdlib's WatchedFileHandler).  The stdlib's RotatingFileHandler assumes one writer: with a
node's many actor processes it rotates per process and keeps writing into renamed files.
"""
from __future__ import annotations

import fcntl
import logging
import logging.handlers
import os
import threading
from pathlib import Path

MAX_BYTES = 50 * 1024 * 1024
BACKUPS = 5


class SharedRotatingFileHandler(logging.handlers.WatchedFileHandler):
    """Append, reopen when the file was rotated away, rotate when it is too big (see above)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        super().__init__(str(path), delay=False)
        self.max_bytes, self.backups = max_bytes, backups
        self.lock_path = str(path) + ".lock"

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)              # reopens first if another process rotated the file
        try:
            if self.stream is not None and self.stream.tell() >= self.max_bytes:
                self._rotate()
        except OSError:
            pass                          # a log that cannot rotate must never stop an actor

    def _rotate(self) -> None:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if os.stat(self.baseFilename).st_size < self.max_bytes:
                    return                # another process rotated it meanwhile
                for k in range(self.backups - 1, 0, -1):
                    older = f"{self.baseFilename}.{k}"
                    if os.path.exists(older):
                        os.replace(older, f"{self.baseFilename}.{k + 1}")
                os.replace(self.baseFilename, self.baseFilename + ".1")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self.reopenIfNeeded()

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
    handler = SharedRotatingFileHandler(log_dir / "actors.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
