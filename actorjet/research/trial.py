"""One trial of a study: an embedded ActorJet head (its own process and run dir) running a
job until its last step is trained and evaluated.

    python -m actorjet.research.trial RUN_DIR

The controller writes ``RUN_DIR/job.json`` and ``RUN_DIR/trial.json`` (the study's ``[trials]``
table with this trial's port: where the head listens, its token, tree and own runner slots;
by default a free port on 127.0.0.1 and two runners of its own).  On a swarm's node the
node's TrialHost writes them (runner/trial_runs.py), with the seed of the study's model.

The controller watches ``RUN_DIR/metrics.jsonl`` (the learner's periodic evals), never this
process's output, and stops it by PID when the pruner says so.  A study's controller and a
swarm's node fork their trials from research/trial_server.py, which has run ``preload``
first; the benches and tests/test_stops.py start this module as a process of its own.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

RUNNERS = 2
QUIET_S = 180.0      # no learner step for this long: the trial has failed


def _read(run: Path) -> tuple[dict, dict]:
    """The trial's job and where it runs (``trial.json``; absent: the defaults)."""
    job = json.loads((run / "job.json").read_text())
    where = json.loads((run / "trial.json").read_text()) if (run / "trial.json").exists() else {}
    return job, where


def _tree(where: dict):
    from actorjet.config import tree_path
    from actorjet.runtime.tree_spec import load_tree

    return load_tree(where.get("tree") or tree_path("default.toml"))


def preload(run_dir: str) -> None:
    """Import what this trial's head will import (runtime/kinds.py), running nothing: in the
    trial server, before it forks the trial."""
    import importlib

    from actorjet.runtime import kinds

    for module in ("actorjet.monitor.metrics", "actorjet.models.prepare", "actorjet.runtime.head"):   # main's own
        importlib.import_module(module)
    job, where = _read(Path(run_dir))
    kinds.preload(_tree(where).kinds(), job)


def main(run_dir: str) -> int:
    from actorjet.monitor import metrics
    from actorjet.models.prepare import check_tasks, prepare
    from actorjet.runtime import messages as m
    from actorjet.runtime.head import Head
    from actorjet.runtime.system import free_port

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stopped: the head is stopped cleanly
    run = Path(run_dir)
    job, where = _read(run)
    if not all(m.get("path") and Path(m["path"]).is_dir() for m in job["models"]):
        prepare(job, seed=where.get("model_seed"))   # on a swarm's node: the study's starting model, built here
    else:
        check_tasks(job)                              # the controller handed over the study's built model
    steps = job["train"]["steps"]
    token = Path(where["token_file"]).read_text().strip() if where.get("token_file") else None
    tree = _tree(where)
    head = Head(run, tree, job, host=where.get("host", "127.0.0.1"), advertise=where.get("advertise") or None,
                port=where.get("port") or free_port(), slots=where.get("slots", RUNNERS), token=token)
    head.start()
    try:
        last, since = -1, time.time()
        follower = metrics.Follower(run)
        while True:
            msg = head.poll(0.5)
            if isinstance(msg, m.Escalated) and msg.path == "root":
                print(f"trial failed: the supervisor tree gave up: {msg.reason}", file=sys.stderr)
                return 1
            rows = follower.read()
            train = [r["step"] for r in rows if r.get("kind") == "train"]
            evals = [r["step"] for r in rows if r.get("kind") == "eval"]
            step = train[-1] if train else 0
            if step != last:
                last, since = step, time.time()
            if step >= steps and evals and evals[-1] >= steps:
                return 0
            if time.time() - since > QUIET_S:
                print(f"trial failed: no learner step for {QUIET_S:.0f} s", file=sys.stderr)
                return 1
    finally:
        head.stop()


if __name__ == "__main__":
    from actorjet.runtime.leave import run_then_leave

    run_then_leave(main, sys.argv[1])
