"""One kill-loop run: a short training on its own head, one child SIGKILLed at a random
moment, and what came of it.  Shared by tests/test_hangs.py (a few runs) and
bench/kill_loop.py (20 runs per child, the issue's figure).

A run passes when training reaches its final step in time and no thread died unseen.  Half
the moments are a time drawn from the head's first seconds (model loading, the first
rollouts), half a learner step drawn from the training plus up to 0.3 s (rollouts,
optimizer steps and weight publishing), so a slow machine cannot push every kill into
start-up.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from pathlib import Path

from jobs import tiny_arith
from swarm import REPO, Swarm, pid_of, wait_until
TARGETS = {"learner": "model.policy/learner", "engine": "model.policy/engine"}


def kill_run(swarm: Swarm, tmp: Path, target: str, rng: random.Random, steps: int = 24,
             window_s: float = 6.0, finish_s: float = 240.0) -> dict:
    """Start a head, SIGKILL ``target`` ("learner" or "engine"; "learner+engine": one, then
    the other) once each at a random moment (see above), wait for the final step.  Returns
    the run's figures; never raises for a run that fails (the caller counts)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "job.toml").write_text(tiny_arith(steps, model="checkpoint_every = 2", train="stall_s = 30.0"))
    run_dir = tmp / "run"
    started = time.time()
    proc, port, _ = swarm.head(run_dir, str(REPO / "supervisors" / "default.toml"), slots=1,
                               extra=["--config", str(tmp / "job.toml")])
    from actorjet.runtime.head import attach_root, status as head_status

    def status() -> dict:
        return head_status(*attach_root(port))

    def step() -> int:
        return status()["models"][0]["learner_step"]

    out = {"target": target, "at_step": None, "replaced": [], "delay_s": None, "killed_pid": None, "killed_at_step": None,
           "final_step": None, "reached_final_step": False, "seconds_to_finish": None,
           "restarts": 0, "stalls_detected": 0, "stalls_healed": 0, "thread_deaths": 0, "threads_crashed_loudly": 0, "error": ""}
    killed_pids: dict[str, int] = {}
    try:
        for i, name in enumerate(target.split("+")):
            first = 1 if i == 0 else min(step() + 1, steps - 3)
            at_step = rng.randint(first, steps - 3) if rng.random() < 0.5 else None
            delay = rng.uniform(0.0, 0.3 if at_step else (window_s if i == 0 else 2.0))
            out.update(at_step=at_step, delay_s=round(delay, 2))
            if at_step:
                wait_until(lambda: step() >= at_step, 120, interval_s=0.05, what=f"learner step {at_step}")
            time.sleep(delay)
            pid = wait_until(lambda: pid_of(port, TARGETS[name]), 60, interval_s=0.1, what=f"the {name}'s pid")
            with contextlib.suppress(Exception):
                out["killed_at_step"] = step()
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
            out["killed_pid"] = pid
            killed_pids[name] = pid
        data = wait_until(lambda: (s := status())["training_finished"] and s, finish_s, interval_s=0.5,
                          what=f"{steps} learner steps")
        # A kill in the last steps can end training (from groups already pulled) before the
        # supervisor has restarted the child: give it a moment.  "replaced": each killed child
        # runs again in a new process; "restarted" is what status counts.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: all(pid_of(port, TARGETS[n]) not in (None, p) for n, p in killed_pids.items()), 20,
                       interval_s=0.2, what="the killed children back")
        out["replaced"] = sorted(f"root/{TARGETS[n]}" for n, p in killed_pids.items()
                                 if pid_of(port, TARGETS[n]) not in (None, p))
        with contextlib.suppress(AssertionError):
            data = wait_until(lambda: (lambda s: s if set(out["replaced"]) <= set(s["restarts"]) else None)(status()), 5,
                              interval_s=0.2, what="the restarts counted")
        out.update(final_step=data["models"][0]["learner_step"], seconds_to_finish=round(time.time() - killed, 1),
                   restarts=sum(data["restarts"].values()), restarted=data["restarts"],
                   stalls_detected=data["stalls_detected"],
                   stalls_healed=data["stalls_healed"])
        out["reached_final_step"] = out["final_step"] == steps
    except Exception as e:  # noqa: BLE001 - a failed run is a figure, not a crash of the loop
        out["error"] = f"{type(e).__name__}: {e}"[:300]
        out["evidence"] = evidence(status, run_dir)
    finally:
        swarm.cleanup()
        swarm.procs.clear()
        swarm.ports.clear()
    for log in run_dir.rglob("actors.log"):
        text = log.read_text(errors="replace")
        out["thread_deaths"] += text.count("uncaught exception in thread")      # would have died unseen
        out["threads_crashed_loudly"] += len(re.findall(r"thread \S+ of pid \d+ died", text))
    out["wall_s"] = round(time.time() - started, 1)
    return out


def evidence(status, run_dir: Path) -> str:
    """What a failed run leaves to explain it (the run directory is deleted after): the
    head's last word on the learner, and the tail of the actors' log."""
    try:
        s = status()
        facts = {k: s.get(k) for k in ("training_finished", "restarts", "stalls_detected", "waiting")}
        facts["models"] = [{k: v for k, v in mm.items() if k in ("learner_step", "weight_version", "consumed")}
                           for mm in s.get("models", [])]
    except Exception as e:  # noqa: BLE001 - the head itself may be the problem
        facts = {"status": f"{type(e).__name__}: {e}"}
    logs = sorted(run_dir.rglob("actors.log"))
    tail = "".join(log.read_text(errors="replace")[-2500:] for log in logs)
    return f"status: {facts}\nactors.log tail:\n{tail}"

