"""A full disk: how every writer of a run directory meets it, and how the swarm pauses on it.

A week-long run fills disks: a neighbour's job, a forgotten export, logs.  ``ENOSPC`` used to
surface wherever it struck — a learner crashing in a restart loop, a gateway whose writer
thread failed every call, a torn line in metrics.jsonl.  Now each writer (the gateway's call
recorder, the learner's weight versions, checkpoints and store updates, the registry's
metrics writer) turns it into one report, ``proto.DiskFull(who, cause)``, keeps what it had
not written yet, and tries again every ``RETRY_S``; the registry leases no new episodes while
any report stands, and ``actorjet status`` says so in one line.  A writer that succeeds again
clears its report (``cause=""``), and training goes on by itself.

Nothing already on disk is touched by a failed write: weight versions and checkpoints become
visible only by a rename once whole, SQLite rolls the failed transaction back, and a metrics
line is written whole or not at all.
"""
from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

RETRY_S = 2.0        # how often a paused writer tries again
# A paused gateway resumes when this much is free: more than one failed write frees when its
# writer removes the torn part (a partial checkpoint), so a full disk does not flicker unpaused.
RESUME_BYTES = 64 << 20


def is_full(e: BaseException) -> bool:
    """Did this write fail because the disk (or the user's quota) is full?"""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(e, sqlite3.OperationalError) and "full" in str(e):       # SQLITE_FULL
        return True
    # libraries that wrap the OS error in their own (safetensors: "I/O error: No space left on
    # device (os error 28)")
    text = str(e)
    return "No space left on device" in text or "Disk quota exceeded" in text or \
        (e.__cause__ is not None and is_full(e.__cause__))


NEARLY_FULL = 1 << 20     # free bytes under which a failed write is blamed on the disk


def free_bytes(folder: str | Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def blame_full_disk(e: Exception, folder: str | Path) -> Exception:
    """A library that hides the OS error (torch.save: "iostream error", "unexpected pos"):
    when its write failed on a disk with next to no room left, call it what it is."""
    if is_full(e) or free_bytes(folder) >= NEARLY_FULL:
        return e
    err = OSError(errno.ENOSPC, f"No space left on device ({type(e).__name__}: {str(e)[:120]})", str(folder))
    err.__cause__ = e
    return err


def describe(e: BaseException, path: str | Path | None = None) -> str:
    """One line: what could not be written, and where."""
    where = path or getattr(e, "filename", None)
    what = e.strerror or str(e) if isinstance(e, OSError) else str(e)
    return what[:200] + (f" ({where})" if where else "")


def append_whole(path: str | Path, data: bytes) -> None:
    """Append ``data`` whole or not at all: a short write on a full disk is cut back off, so
    the next line does not continue a torn one."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def has_room(folder: str | Path, nbytes: int = RESUME_BYTES) -> bool:
    """Can ``nbytes`` be written in ``folder`` now?  (A writer whose own next write may be a
    long way off — a gateway with no calls while leasing is paused — asks this instead.)"""
    probe = Path(folder) / ".disk_probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


class FullDisks:
    """The registry's view: who reported a full disk, and why (who → cause)."""

    def __init__(self):
        self.reports: dict[str, str] = {}

    def report(self, who: str, cause: str) -> None:
        if cause:
            self.reports[who] = cause[:300]
        else:
            self.reports.pop(who, None)

    @property
    def paused(self) -> bool:
        return bool(self.reports)

    def line(self) -> str:
        """The status line ("" when no disk is full)."""
        if not self.reports:
            return ""
        who = "; ".join(f"{k}: {v}" for k, v in sorted(self.reports.items()))
        return (f"PAUSED: disk full — {who}. No new episodes are leased; training goes on by itself "
                "once space is freed.")
