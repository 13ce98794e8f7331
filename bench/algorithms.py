"""Every algorithm on the quickstart's job: how fast and how far each one learns.

    python bench/algorithms.py [--algorithms grpo,ppo,...] [--seeds 3] [--steps 150] [--name algorithms]
                               [--fixed-start]

Runs `actorjet quickstart --algorithm A --seed S --steps N` for every algorithm and seed
(``--fixed-start``: every run starts from the shipped checkpoint, ``--warmup-seed 0``, and the
seed varies training only; without it the seed also picks the warm-up, as `--seed` does),
interleaved (seed 0 of every algorithm, then seed 1, …) so a slow stretch of the machine is
shared.  From each run's metrics.jsonl: the first evaluation (every 10 steps) at or above the
quickstart's bar of 55% held-out accuracy — its step and seconds since the first step — and the
accuracy at the last step.  Prints a table with means and 95% t-intervals over the seeds and
writes bench/results/<name>.json (each run's rows too).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from common import interval, parse, table, write  # noqa: E402

from actorjet.rl.algorithms import ALGORITHMS  # noqa: E402

BAR = 0.55


def one_run(algorithm: str, seed: int, steps: int, work: Path, fixed_start: bool) -> dict:
    run = work / f"{algorithm}-{seed}"
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "quickstart", "--algorithm", algorithm,
                          "--seed", str(seed), "--steps", str(steps), "--run-dir", str(run)]
                         + (["--warmup-seed", "0"] if fixed_start else []),
                         capture_output=True, text=True, cwd=REPO, timeout=3600)
    if out.returncode != 0:          # its logs are kept for a look
        kept = Path(tempfile.mkdtemp(prefix=f"aj-algorithms-failed-{algorithm}-{seed}-"))
        shutil.copytree(run, kept, dirs_exist_ok=True)
        return {"algorithm": algorithm, "seed": seed, "error": (out.stdout + out.stderr)[-2000:], "kept": str(kept)}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    start = train[0]["time"] - train[0]["step_time_s"]
    step_time = {r["step"]: r["time"] for r in train}
    reached = next((e for e in evals if e["accuracy"] >= BAR and e["step"] > 0), None)
    return {"algorithm": algorithm, "seed": seed, "wall_s": round(time.time() - t0, 1),
            "before": evals[0]["accuracy"], "after": evals[-1]["accuracy"],
            "steps_to_bar": reached["step"] if reached else None,
            "seconds_to_bar": round(step_time[reached["step"]] - start, 1) if reached else None,
            "evals": [(e["step"], e["accuracy"]) for e in evals],
            "reward_first10": sum(r["reward_mean"] for r in train[:10]) / max(1, len(train[:10])),
            "reward_last10": sum(r["reward_mean"] for r in train[-10:]) / max(1, len(train[-10:])),
            **{k: train[-1].get(k) for k in ("value_loss", "logprob_mismatch", "clip_frac")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--name", default="algorithms")
    ap.add_argument("--fixed-start", action="store_true", help="every run from the shipped checkpoint")
    args = parse(ap, {"algorithms": "rloo", "seeds": 1, "steps": 2})
    names = args.algorithms.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="aj-algorithms-") as work:
        for seed in range(args.seeds):
            for name in names:
                runs.append(one_run(name, seed, args.steps, Path(work), args.fixed_start))
                r = runs[-1]
                print(f"  {name} seed {seed}: " + (f"{r['before']:.3f} → {r['after']:.3f}, bar at step "
                                                  f"{r['steps_to_bar']} in {r['wall_s']} s" if "error" not in r
                                                  else "FAILED " + r["error"][-300:]), flush=True)
    rows = []
    for name in names:
        mine = [r for r in runs if r["algorithm"] == name and "error" not in r]
        reached = sum(r["steps_to_bar"] is not None for r in mine)
        rows.append((name, f"{reached}/{len(mine)}", interval([r["steps_to_bar"] for r in mine]),
                     interval([r["seconds_to_bar"] for r in mine]), interval([r["after"] for r in mine])))
    table(rows, ("algorithm", "reached 55%", "steps to 55%", "seconds to 55%", f"held-out after {args.steps}"))
    write(args.name, {"steps": args.steps, "seeds": args.seeds, "fixed_start": args.fixed_start, "bar": BAR, "runs": runs,
                      "table": [dict(zip(("algorithm", "reached", "steps_to_bar", "seconds_to_bar", "after"), r))
                                for r in rows]})


if __name__ == "__main__":
    main()
