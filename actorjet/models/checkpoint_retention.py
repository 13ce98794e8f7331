"""Which checkpoints a learner keeps: the newest ``keep_last`` and the ``keep_best`` with the
highest held-out accuracy.

A checkpoint is a whole model (or adapter) plus its optimizer state: kept without a limit, a
week-long run fills its disk.  The newest is what a restarted learner resumes from and what
``actorjet export`` takes by default, so it is always kept; the best by held-out accuracy is
what one exports in the end (``actorjet export --step N``).  A checkpoint's score is the mean
held-out accuracy over the tasks evaluated at its step (``score.json`` beside it, written when
that evaluation finishes: evaluations run after the step, in their own thread).
"""
from __future__ import annotations

import json
import os
import shutil
import logging
from pathlib import Path

from actorjet import disk

log = logging.getLogger("actorjet")


def to_delete(steps: list[int], scores: dict[int, float], keep_last: int, keep_best: int) -> list[int]:
    """The checkpoint steps to delete: all but the newest ``keep_last`` (at least the newest
    one) and the ``keep_best`` best scored (ties: the later step)."""
    newest = sorted(steps)[-max(1, keep_last):] if steps else []
    scored = sorted((s for s in steps if s in scores), key=lambda s: (scores[s], s), reverse=True)
    keep = set(newest) | set(scored[:max(0, keep_best)])
    return sorted(s for s in steps if s not in keep)


def record_score(folder: Path, step: int, accuracy: float) -> None:
    """Add one task's held-out accuracy to the checkpoint of ``step`` (if there is one)."""
    out = folder / f"step_{step:06d}"
    if not (out / "state.json").exists():
        return
    path = out / "score.json"
    partial = out / "score.json.partial"       # replaced whole: a full disk never tears it
    try:
        partial.write_text(json.dumps(_scores(path) + [accuracy]))
        os.replace(partial, path)
    except OSError as e:                        # a full disk: this checkpoint is not ranked by score
        if not disk.is_full(e):
            raise
        partial.unlink(missing_ok=True)
        log.warning("the held-out score of %s could not be written: %s", out, e)


def _scores(path: Path) -> list[float]:
    try:
        values = json.loads(path.read_text()) if path.exists() else []
    except (ValueError, OSError):
        return []
    return [v for v in values if isinstance(v, (int, float))] if isinstance(values, list) else []


def prune(folder: Path, keep_last: int, keep_best: int) -> list[int]:
    """Delete the checkpoints ``to_delete`` names under ``folder``; returns their steps."""
    steps, scores = [], {}
    for state in folder.glob("step_*/state.json"):
        step = int(state.parent.name.removeprefix("step_"))
        steps.append(step)
        values = _scores(state.parent / "score.json")
        if values:
            scores[step] = sum(values) / len(values)
    gone = to_delete(steps, scores, keep_last, keep_best)
    for step in gone:
        shutil.rmtree(folder / f"step_{step:06d}", ignore_errors=True)
    if gone:
        log.info("%s: checkpoints of steps %s deleted (keeping the newest %d and the best %d)", folder, gone,
                 keep_last, keep_best)
    return gone
