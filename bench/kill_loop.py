"""Kill loop: SIGKILL the learner in N runs of a short training, and the engine in N more.

    python bench/kill_loop.py [--runs 20] [--steps 24] [--seed 0]

Each run is a fresh head training tiny-arith for ``--steps`` steps (tests/killloop.py); one
child is killed once: in half the runs at a time drawn from the head's first seconds (model
loading, first rollouts), in the other half just after a learner step drawn from the
training (rollouts, optimizer step, weight publishing).  A run passes when training reaches
its final step and no thread died unseen.  Prints a table per target and writes
bench/results/kill_loop.json (every run, and the totals).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from common import parse, table, write  # noqa: E402
from killloop import TARGETS, kill_run  # noqa: E402
from swarm import Swarm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per target (default 20)")
    parser.add_argument("--steps", type=int, default=24, help="learner steps per run (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    args = parse(parser, {"runs": 1, "steps": 6})
    rng = random.Random(args.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="aj-killloop-") as tmp:
        swarm = Swarm(Path(tmp))
        try:
            for i in range(args.runs):
                for target in TARGETS:               # interleaved: a drifting machine hits both alike
                    out = kill_run(swarm, Path(tmp) / f"{target}-{i}", target, rng, steps=args.steps)
                    runs.append(out)
                    when = f"step {out['at_step']} + {out['delay_s']:.2f} s" if out["at_step"] else f"{out['delay_s']:.1f} s"
                    print(f"{target:8s} run {i + 1:2d}/{args.runs}: killed at {when} "
                          f"(learner at step {out['killed_at_step']}), final step {out['final_step']}, "
                          f"{out['seconds_to_finish']} s to finish {out['error']}", flush=True)
                    if out.get("evidence"):
                        print(out["evidence"], flush=True)
        finally:
            swarm.cleanup()
    rows, totals = [], {}
    for target in TARGETS:
        mine = [r for r in runs if r["target"] == target]
        finish = [r["seconds_to_finish"] for r in mine if r["reached_final_step"]]
        totals[target] = {
            "runs": len(mine), "reached_final_step": sum(r["reached_final_step"] for r in mine),
            "thread_deaths_unseen": sum(r["thread_deaths"] for r in mine),
            "threads_crashed_loudly": sum(r["threads_crashed_loudly"] for r in mine),
            "stalls_detected": sum(r["stalls_detected"] for r in mine),
            "stalls_healed": sum(r["stalls_healed"] for r in mine),
            "restarts": sum(r["restarts"] for r in mine),
            "median_s_kill_to_finish": round(statistics.median(finish), 1) if finish else None,
            "max_s_kill_to_finish": max(finish, default=None)}
        t = totals[target]
        rows.append((target, t["runs"], t["reached_final_step"], t["thread_deaths_unseen"], t["restarts"],
                     f"{t['stalls_detected']}/{t['stalls_healed']}", t["median_s_kill_to_finish"],
                     t["max_s_kill_to_finish"]))
    table(rows, ("killed", "runs", "reached final step", "silent thread deaths", "restarts",
                 "stalls found/healed", "median s to finish", "max s to finish"))
    write("kill_loop", {"steps": args.steps, "seed": args.seed, "totals": totals, "runs": runs})
    return 0 if all(t["reached_final_step"] == t["runs"] for t in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
