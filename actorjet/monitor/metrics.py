"""metrics.jsonl (one JSON object per learner step or evaluation) and the reward-curve plot."""
from __future__ import annotations

import json
import time
from pathlib import Path

from actorjet import disk


class Writer:
    """Appends lines to RUN_DIR/metrics.jsonl, each whole or not at all.  On a full disk the
    lines wait here (up to ``MAX_WAITING``, then the oldest waiting are dropped and counted)
    and go out, in order, with the next write that finds space: ``cause`` says why they wait."""

    MAX_WAITING = 100_000

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.waiting: list[bytes] = []
        self.dropped = 0
        self.cause = ""

    def write(self, record: dict | None = None) -> str:
        """Add a line (None: only retry what waits); returns the disk-full cause, or ""."""
        if record is not None:
            self.waiting.append((json.dumps({"time": time.time(), **record}) + "\n").encode())
            if len(self.waiting) > self.MAX_WAITING:
                self.dropped += len(self.waiting) - self.MAX_WAITING
                del self.waiting[:len(self.waiting) - self.MAX_WAITING]
        if self.waiting:
            try:
                disk.append_whole(self.path, b"".join(self.waiting))
                self.waiting.clear()
                self.cause = ""
            except OSError as e:
                if not disk.is_full(e):
                    raise
                self.cause = f"{len(self.waiting)} metrics lines wait: {disk.describe(e, self.path)}"
        return self.cause


def read(run_dir: str | Path) -> list[dict]:
    return read_counted(run_dir)[0]


def read_counted(run_dir: str | Path) -> tuple[list[dict], int]:
    """(the lines that are JSON objects, how many others were skipped).  A last line without
    its newline is being written right now: not counted as malformed."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return [], 0
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] and not text.endswith("\n"):
        lines = lines[:-1]
    rows, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


class Follower:
    """metrics.jsonl read as it grows: each call parses only the whole lines appended since
    the last (a progress bar polls it twice a second; re-reading the whole file each time
    took a third of a core by step 80, competing with the swarm it watches)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.offset = 0
        self.rows: list[dict] = []

    def read(self) -> list[dict]:
        """Every line so far that is a JSON object (the same list, grown)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.rows
        whole = chunk[:chunk.rfind(b"\n") + 1]        # a line without its newline is being written
        self.offset += len(whole)
        for line in whole.decode(errors="replace").split("\n"):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    self.rows.append(row)
        return self.rows


def plot(run_dir: str | Path) -> Path | None:
    """plots/reward_curve.png: training reward and held-out accuracy per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read(run_dir)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    models = sorted({r["model"] for r in rows if "model" in r})
    for model in models:
        train = [r for r in rows if r.get("kind") == "train" and r["model"] == model]
        if train:
            ax.plot([r["step"] for r in train], [r["reward_mean"] for r in train], label=f"{model}: train reward", alpha=0.7)
        evals = [r for r in rows if r.get("kind") == "eval" and r["model"] == model]
        for task in sorted({r.get("task", "") for r in evals}):     # one line per task with an eval set
            points = [r for r in evals if r.get("task", "") == task]
            name = f"{model}: held-out accuracy" + (f" ({task})" if task else "")
            ax.plot([r["step"] for r in points], [r["accuracy"] for r in points], "o-", label=name)
    ax.set_xlabel("learner step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("ActorJet run")
    out = Path(run_dir) / "plots" / "reward_curve.png"
    out.parent.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
