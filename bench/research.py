"""The shipped study, run unattended and checked against what a careful person would do.

    python bench/research.py [--kills 3] [--seed 0]

1. `actorjet research run agents/studies/lr.toml` (lr over 1e-5…1e-2, log; checkpoint_every
   as a knob that changes nothing), its controller SIGKILLed at ``--kills`` random moments and
   started again each time.  Checks: it finishes; no trial (stage, arm, seed) finished twice.
2. A full grid of the same budget: ``explore.trials`` learning rates spaced evenly in log
   space, one seed each, run to the end.  The grid's best lr and its two neighbours make the
   range a grid would recommend; the study's recommendation should fall in it.
3. Early stopping: the explore trials the pruner stopped are run to the end; the savings are
   1 - (trial-steps the study spent in explore) / (trial-steps of every explore trial run to
   its end), and the winner must be the same.
4. The null knob (checkpoint_every) must be reported as "no detectable difference" (it is, if
   the study adopts a change and ablates it; otherwise the bench says it was not tested).

Prints a table and writes bench/results/research.json.  Target: ≤ 40 min in all on this
2-core machine; savings ≥ 40% with the same winner; 0 duplicated trials.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from common import parse, table, write  # noqa: E402

from actorjet.research.controller import score  # noqa: E402
from actorjet.runner.trial_runs import TRIAL_SERVER  # noqa: E402
from actorjet.runtime.forks import ForkServer  # noqa: E402
from actorjet.runtime.system import kill_group  # noqa: E402
from actorjet.research.plan import SEED_BASE  # noqa: E402
from actorjet.research.study_spec import apply, load_study  # noqa: E402

STUDY = REPO / "agents" / "studies" / "lr.toml"
# --smoke: the same study shrunk to seconds a trial (one seed a stage, 2 explore arms, 4 steps)
SMOKE_STUDY = [("steps = 60", "steps = 4"), ("eval_every = 20", "eval_every = 2"), ("groups_per_step = 32",
               "groups_per_step = 4"), ("trials = 8", "trials = 2"), ("baseline = 3", "baseline = 1"),
               ("confirm = 3", "confirm = 1"), ("ablate = 3", "ablate = 1")]


def run_study(out: Path, study: Path, kills: int, rng: random.Random, expected_s: float) -> dict:
    moments = sorted(rng.uniform(0.1, 0.8) * expected_s for _ in range(kills))
    t0, killed = time.time(), []
    for at in moments + [None]:
        proc = subprocess.Popen([sys.executable, "-m", "actorjet.cli.main", "research", "run", str(study),
                                 "--dir", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        if at is None:
            proc.wait()
            if proc.returncode != 0:
                raise RuntimeError(f"the study failed (exit {proc.returncode})")
            break
        while proc.poll() is None and time.time() - t0 < at:
            time.sleep(1)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)        # the controller only: its trials outlive it
            proc.wait()
            killed.append(round(time.time() - t0, 1))
    return {"wall_s": time.time() - t0, "killed_at_s": killed}


def run_job(server: ForkServer, job: dict, run_dir: Path) -> list:
    """One trial, run to the end outside the study (forked as the study forks its trials):
    its evals [(step, accuracy)]."""
    run_dir.mkdir(parents=True)
    (run_dir / "job.json").write_text(json.dumps(job))
    trial = server.start(run_dir)
    try:
        code = trial.wait(900)
    finally:
        kill_group(trial.pid)        # (a no-op once it has ended: its head stopped with it)
    if code != 0:
        raise RuntimeError(f"the trial in {run_dir} failed (exit status {code}): see its trial.log")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["accuracy"]) for r in rows if r.get("kind") == "eval"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = parse(ap, {"kills": 0})    # (tests/test_research.py kills a controller)
    t_start = time.time()
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.closing(ForkServer(TRIAL_SERVER, Path(tmp_name))) as server:
        tmp = Path(tmp_name)
        study_file = STUDY
        if args.smoke:
            text = STUDY.read_text()
            for old, new in SMOKE_STUDY:
                assert old in text, f"{STUDY} changed: update SMOKE_STUDY ({old!r})"
                text = text.replace(old, new)
            study_file = tmp / "lr-smoke.toml"
            study_file.write_text(text)
        study = load_study(study_file)
        out = tmp / "study"
        ran = run_study(out, study_file, args.kills, random.Random(args.seed),
                        expected_s=60 if args.smoke else 15 * 60)
        db = sqlite3.connect(out / "study.sqlite")
        rows = db.execute("SELECT stage, arm, seed, state, params, evals, metric, job FROM trials").fetchall()
        keys = [(a, b, c) for a, b, c, *_ in rows]
        duplicated = len(keys) - len(set(keys))
        results = json.loads((out / "results.json").read_text())
        decisions = results["decisions"]
        adopted = next((d["evidence"].get("adopted") for d in decisions if d["stage"] == "confirm"), False)
        best = next((d["evidence"]["params"] for d in decisions if d["stage"] == "explore"), {})
        lr_knob = "models.policy.lr"
        recommended = best.get(lr_knob) if adopted else study["knobs"][lr_knob]["base"]
        steps = study["base_job"]["train"]["steps"]
        models = {m["name"]: m["path"] for m in json.loads(rows[0][7])["models"]}

        def job_for(params: dict, seed: int) -> dict:
            job = apply(study["base_job"], params)
            job["train"]["seed"] = seed
            for m in job["models"]:
                m["path"] = models[m["name"]]
            return job

        # early stopping: what the explore stage spent vs every explore trial to its end
        explore = [r for r in rows if r[0] == "explore"]
        spent = sum(json.loads(r[5])[-1][0] if json.loads(r[5]) else 0 for r in explore)
        full_cost = steps * len(explore)
        finals = {}
        for stage, arm, seed, state, params, evals, metric, _ in explore:
            if state == "pruned":
                evals = run_job(server, job_for(json.loads(params), seed), tmp / "unpruned" / arm)
                finals[arm] = score(evals, study["metric"], steps)
            elif state == "done":
                finals[arm] = metric
        study_winner = max(((a, m) for _, a, _, s, _, _, m, _ in explore if s == "done"), key=lambda x: x[1])[0]
        full_winner = max(finals, key=finals.get)
        # the grid of the same budget
        n = study["explore"]["trials"]
        lo, hi = study["knobs"][lr_knob]["values"]
        grid = [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)) for i in range(n)]
        grid_scores = []
        for i, lr in enumerate(grid):
            evals = run_job(server, job_for({lr_knob: lr}, SEED_BASE["explore"]), tmp / "grid" / f"{i}")
            grid_scores.append(score(evals, study["metric"], steps))
        k = max(range(n), key=lambda i: grid_scores[i])
        grid_range = [grid[max(0, k - 1)], grid[min(n - 1, k + 1)]]
        null = [d["text"] for d in decisions if d["stage"] == "ablate" and "checkpoint_every" in d["text"]]
    wall = time.time() - t_start
    result = {
        "study_wall_s": ran["wall_s"], "total_wall_s": wall, "controller_killed_at_s": ran["killed_at_s"],
        "trials": len(rows), "duplicated_trials": duplicated,
        "states": {s: sum(1 for r in rows if r[3] == s) for s in {r[3] for r in rows}},
        "conclusion": results["conclusion"], "adopted": adopted, "recommended_lr": recommended,
        "grid": dict(zip([f"{x:.2e}" for x in grid], grid_scores)), "grid_best_range": grid_range,
        "recommended_in_grid_range": grid_range[0] <= recommended <= grid_range[1],
        "explore_trial_steps_spent": spent, "explore_trial_steps_unpruned": full_cost,
        "early_stopping_savings": 1 - spent / full_cost, "winner_with_pruning": study_winner,
        "winner_without_pruning": full_winner, "same_winner": study_winner == full_winner,
        "null_knob": null[0] if null else "not ablated (nothing adopted, or the knob was not varied)",
        "null_knob_no_difference": bool(null) and "no detectable difference" in null[0]
        and all(int(n) >= 2 for n in re.search(r"n = (\d+) vs (\d+)", null[0]).groups()),
    }
    table([("study wall time (with kills)", f"{ran['wall_s'] / 60:.1f} min", "<= 40 min"),
           ("controller SIGKILLs / duplicated trials", f"{len(ran['killed_at_s'])} / {duplicated}", "3 / 0"),
           ("recommended lr", f"{recommended:.2e}", f"in grid's best range {grid_range[0]:.1e}…{grid_range[1]:.1e}"),
           ("early stopping: trial-steps saved", f"{result['early_stopping_savings']:.0%}", ">= 40%"),
           ("same winner without pruning", str(result["same_winner"]), "True"),
           ("null knob (checkpoint_every)", result["null_knob"][:80], "no detectable difference"),
           ("conclusion", results["conclusion"][:100], "-")], ("measure", "result", "target"))
    write("research", result)


if __name__ == "__main__":
    main()
