"""A node's research trials: each one a process of its own, watched from its files.

The node's TrialHost actor (actors/trial_host.py) owns one ``TrialRuns``.  A trial runs
research/trial.py in ``NODE_DIR/trials/TRIAL_ID``, forked from the node's trial server
(research/trial_server.py through runtime/forks.py, which has imported what a trial needs):
an embedded head on this node, on a free local port, with runner slots of its own, building
the study's starting model here from its seed (hosts share nothing: the controller's model
directory is not on this machine).  Its progress is read from its ``metrics.jsonl``, never
its output.

Each trial leads its own process group (it and the head it embeds), so a stop ends with a
SIGKILL of that group; and it gets SIGTERM, which stops its head cleanly, if the node's
actor system dies under it (Linux's parent-death signal, through the server).
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from actorjet.monitor import metrics
from actorjet.runtime import system
from actorjet.runtime.forks import ForkServer, Forked

STOP_GRACE_S = 20.0
TRIAL_SERVER = "actorjet.research.trial_server"   # the module, by name: the runner may not import research
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


@dataclass
class Run:
    trial_id: str
    dir: Path
    proc: Forked
    step: int = -1
    evals: list = field(default_factory=list)
    stop_by: float = 0.0         # stopping: the group is killed at this time if still alive
    follower: metrics.Follower = field(init=False)     # its metrics.jsonl: each poll parses the new lines

    def __post_init__(self):
        self.follower = metrics.Follower(self.dir)


class TrialRuns:
    def __init__(self, base: Path):
        self.base = Path(base)
        self.runs: dict[str, Run] = {}
        self.server = ForkServer(TRIAL_SERVER, self.base, term_with_parent=True)

    def start(self, trial_id: str, job: dict, model_seed: int, slots: int) -> None:
        """Start a trial (ValueError for an id that cannot name a directory, or one running)."""
        if not SAFE_ID.match(trial_id):
            raise ValueError(f"trial id {trial_id!r} is not a safe directory name")
        if trial_id in self.runs:
            raise ValueError(f"trial {trial_id!r} is already running on this node")
        run = self.base / trial_id
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        job = json.loads(json.dumps(job))
        for model in job.get("models", []):
            model.pop("path", None)          # a directory of the controller's machine: built here
        (run / "job.json").write_text(json.dumps(job))
        (run / "trial.json").write_text(json.dumps({"slots": slots, "model_seed": model_seed}))
        self.runs[trial_id] = Run(trial_id, run, self.server.start(run))

    def stop(self, trial_id: str) -> None:
        """Ask it to stop (its head stops cleanly); ``poll`` kills its group after a grace."""
        run = self.runs.get(trial_id)
        if run is not None and not run.stop_by:
            with contextlib.suppress(ProcessLookupError):
                run.proc.terminate()
            run.stop_by = time.monotonic() + STOP_GRACE_S

    def stop_all(self) -> None:
        for run in self.runs.values():
            system.kill_group(run.proc.pid)
            run.proc.wait()
            system.kill_head_of(run.dir)
        self.runs.clear()
        self.server.close()

    def poll(self) -> list[tuple]:
        """What changed since the last poll: ("progress", id, step, evals) and
        ("ended", id, exit code, log tail)."""
        out = []
        for trial_id, run in list(self.runs.items()):
            rows = run.follower.read()
            train = [r["step"] for r in rows if r.get("kind") == "train"]
            evals = [[r["step"], r["accuracy"]] for r in rows if r.get("kind") == "eval"]
            step = train[-1] if train else 0
            if step != run.step or evals != run.evals:
                run.step, run.evals = step, evals
                out.append(("progress", trial_id, step, evals))
            code = run.proc.poll()
            if code is None and run.stop_by and time.monotonic() > run.stop_by:
                system.kill_group(run.proc.pid)
                code = run.proc.wait()
            if code is not None:
                system.kill_group(run.proc.pid)          # nothing of its head may outlive it
                system.kill_head_of(run.dir)      # (its actor system is a session of its own)
                del self.runs[trial_id]
                out.append(("ended", trial_id, code, tail(run.dir / "trial.log")))
        return out


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
