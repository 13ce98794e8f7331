"""Cocktail benchmark: does a crashing task hurt a healthy one?  Are the weights kept?

    python bench/cocktail.py [--window 40] [--groups 8]

Runs of tiny-arith with 2 local runners (isolation = "process", mix = "fill"):
  alone      the healthy task only
  cocktail   healthy + a task whose behavior kills its own process in 10% of episodes
  threads    the same cocktail with isolation = "thread" (no isolation, for contrast)
  mix 3:1    two healthy tasks weighted 3:1, mix = "strict", ≥ 200 trained episodes
For each: the healthy task's completed episodes per second over ``--window`` seconds
(after the first learner step) and its aborted episodes.  Writes bench/results/cocktail.json.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import actorjet  # noqa: E402,F401
from actorjet.runtime.head import attach_root, status  # noqa: E402
from common import parse, table, write  # noqa: E402
from swarm import REPO, Swarm, wait_until  # noqa: E402

TASK = """
[[tasks]]
name = "{name}"
source = "actorjet_agents.arithmetic"
behavior = "{behavior}"
weight = {weight}
"""
JOB = """
[[models]]
name = "policy"
source = "tiny-arith"
eval_every = 1000
{tasks}
[train]
group_size = 8
groups_per_step = {groups}
steps = 100000
runner_concurrency = 16
isolation = "{isolation}"
mix = "{mix}"
"""
HEALTHY = ("healthy", "actorjet_agents.arithmetic:behavior")
CRASHY = ("crashy", "actorjet_agents.flaky_arithmetic:behavior")


def run(tmp: Path, label: str, tasks: list, isolation: str, mix: str, window: float, groups: int) -> dict:
    swarm = Swarm(tmp / label)
    job = tmp / f"{label}.toml"
    job.write_text(JOB.format(tasks="".join(TASK.format(name=n, behavior=b, weight=w) for n, b, w in tasks),
                              isolation=isolation, mix=mix, groups=groups))
    try:
        head, port, _ = swarm.head(tmp / label / "run", str(REPO / "supervisors" / "default.toml"), slots=2,
                                   extra=["--config", str(job)])
        get = lambda: status(*attach_root(port))  # noqa: E731
        try:
            wait_until(lambda: get()["models"][0]["learner_step"] >= 1, 180, interval_s=0.5, what="first step")
        except AssertionError:
            print(f"{label}: the head's last lines:\n" + "\n".join(head.lines[-40:]), file=sys.stderr)
            with contextlib.suppress(Exception):
                st = get()
                print(f"{label}: watchdog {st['watchdog']!r}, runners {st['runners']}, groups {st['groups']}, "
                      f"episodes {st['episodes']}, aborted {st['aborted_by_cause']}", file=sys.stderr)
            for log in sorted((tmp / label / "run").rglob("*.log")):
                print(f"== {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]), file=sys.stderr)
            raise
        before, t0 = get()["tasks"], time.time()
        time.sleep(window)
        after, elapsed = get(), time.time() - t0
        out = {name: {"episodes_per_s": (t["completed"] - before[name]["completed"]) / elapsed,
                      "aborted_by_cause": t["aborted_by_cause"]} for name, t in after["tasks"].items()}
        out["learner_steps_per_s"] = after["models"][0]["learner_step"] / (time.time() - t0 + 1e-9)
        if mix == "strict":
            db = sqlite3.connect(tmp / label / "run" / "episodes-policy.sqlite")
            rows = db.execute("SELECT task_name, COUNT(*) FROM groups WHERE trained_step IS NOT NULL "
                              "GROUP BY task_name").fetchall()
            total = sum(n for _, n in rows)
            out["trained_groups"] = dict(rows)
            out["trained_episodes"] = total * 8          # group_size
            out["shares"] = {t: n / total for t, n in rows}
        return out
    finally:
        swarm.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=40.0, help="seconds each run is measured over (default 40)")
    ap.add_argument("--groups", type=int, default=8, help="groups of 8 episodes per learner step (default 8)")
    args = parse(ap, {"window": 2.0, "groups": 2})
    if args.window <= 0 or args.groups < 1:
        ap.error("--window must be positive and --groups at least 1")
    os.environ.update(AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="0", AJ_FLAKY_EXIT="0.1")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        alone = run(tmp, "alone", [(*HEALTHY, 1.0)], "process", "fill", args.window, args.groups)
        cocktail = run(tmp, "cocktail", [(*HEALTHY, 1.0), (*CRASHY, 1.0)], "process", "fill", args.window, args.groups)
        threads = run(tmp, "threads", [(*HEALTHY, 1.0), (*CRASHY, 1.0)], "thread", "fill", args.window, args.groups)
        mix = run(tmp, "mix", [(*HEALTHY, 3.0), ("minor", HEALTHY[1], 1.0)], "process", "strict", args.window, args.groups)
    ratio = cocktail["healthy"]["episodes_per_s"] / alone["healthy"]["episodes_per_s"]
    rows = [("healthy alone", f"{alone['healthy']['episodes_per_s']:.1f} ep/s", "-"),
            ("healthy next to a crashing task (process isolation)",
             f"{cocktail['healthy']['episodes_per_s']:.1f} ep/s = {ratio:.0%} of alone", ">= 80%"),
            ("healthy episodes aborted (process isolation)", sum(cocktail["healthy"]["aborted_by_cause"].values()), "0"),
            ("crashing task: aborted by cause", cocktail["crashy"]["aborted_by_cause"], "-"),
            ("healthy next to a crashing task (thread isolation)",
             f"{threads['healthy']['episodes_per_s']:.1f} ep/s, aborted {threads['healthy']['aborted_by_cause']}", "-"),
            ("mix 3:1 strict: trained shares", {k: round(v, 3) for k, v in mix["shares"].items()},
             "0.75 / 0.25 ± 0.02"),
            ("mix 3:1 strict: trained episodes", mix["trained_episodes"], ">= 200")]
    table(rows, ("measure", "result", "target"))
    write("cocktail", {"alone": alone, "cocktail": cocktail, "threads": threads, "mix_3_to_1": mix,
                       "healthy_rate_ratio": ratio, "crash_rate": 0.1, "window_s": args.window,
                       "tolerance": "strict mix: every batch exact to the group (largest remainders); "
                                    "shares over the run within ±1 group per batch"})


if __name__ == "__main__":
    main()
