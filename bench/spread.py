"""How much learning results vary from run to run: the basis of every learning margin in the
tests and of the figures docs/quickstart.md quotes.

    python bench/spread.py quickstart --runs 10 [--load 1]
    python bench/spread.py chaos|smoke|hosts|shared_base|team --runs 10 [--load 1]

``quickstart`` runs `actorjet quickstart` (150 steps from the shipped checkpoint); the
others run the tests that assert learning, as they are: ``chaos`` (tests/test_chaos.py,
40 steps while runners, a node, the gateway and the learner are killed), ``smoke``
(tests/test_training.py, a 30-step quickstart) and ``hosts`` (tests/test_hosts.py, 30 steps
fed by runners on another host) and ``shared_base`` (tests/test_team.py, two LoRA adapters of
one base, one row per model) and ``team`` (tests/test_team.py, two models with different
tokenizers in one team, one row per model).  Each run's held-out accuracy at its first and last
evaluation, and its mean sampled reward over the last 10 steps minus the first 10, are read
from its metrics.jsonl.  ``--load N`` keeps N busy processes
running beside it (a machine shared with other work).  Prints a table and writes
bench/results/spread_<what>[_load<N>].json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from common import parse, table, write  # noqa: E402

TESTS = {   # name → (test, its run directory below the test's tmp_path)
    "chaos": ("tests/test_chaos.py::test_training_survives_killed_runners_node_gateway_and_learner", "run"),
    "smoke": ("tests/test_training.py::test_quickstart_smoke_reward_rises", "qs"),
    "hosts": ("tests/test_hosts.py::test_runners_on_another_host_train_and_client_mode_from_a_third", "run"),
    "shared_base": ("tests/test_team.py::test_two_adapters_of_one_base_share_one_engine_and_learn_their_own_rewards",
                    "run"),
    "team": ("tests/test_team.py::test_two_models_train_on_their_own_calls_and_both_learn", "run"),
}
MODELS = {"shared_base": ("adder", "rounder"), "team": ("proposer", "verifier")}   # models that learn apart: a row each


def _busy() -> None:
    while True:
        pass


def learning_of(run_dir: Path, model: str | None = None) -> tuple[list[float], float | None]:
    """(held-out accuracies in order, last-10-steps minus first-10-steps mean sampled reward),
    of one model's lines when ``model`` is given."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if model is None or r.get("model") == model]
    train = [r["reward_mean"] for r in rows if r.get("kind") == "train" and r.get("reward_mean") is not None]
    reward_gain = sum(train[-10:]) / 10 - sum(train[:10]) / 10 if len(train) >= 20 else None
    return [r["accuracy"] for r in rows if r.get("kind") == "eval"], reward_gain


def one_run(what: str, tmp: Path, steps: int | None = None) -> dict:
    t0 = time.time()
    if what == "quickstart":
        run_dir = tmp / "run"
        out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "quickstart", "--run-dir", str(run_dir),
                              *(["--steps", str(steps)] if steps else [])],
                             capture_output=True, text=True, timeout=1800, cwd=REPO)
    else:
        test, run_name = TESTS[what]
        # -n0: one test, in this process's view; under setup.cfg's xdist workers its tmp_path
        # would be a level deeper and the run directory not found (every row read "None")
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", test,
                              "--basetemp", str(tmp / "pt")], capture_output=True, text=True, timeout=1800, cwd=REPO)
        run_dir = next((tmp / "pt").glob(f"*/{run_name}"), tmp / "missing")
    runs, found = [], (run_dir / "metrics.jsonl").exists()
    for name in MODELS.get(what, (None,)):
        evals, reward_gain = learning_of(run_dir, name) if found else ([], None)
        tail = "" if out.returncode == 0 else out.stdout[-400:]
        runs.append({"ok": out.returncode == 0 and found, "model": name, "first": evals[0] if evals else None,
                     "last": evals[-1] if evals else None, "reward_gain": reward_gain,
                     "seconds": round(time.time() - t0, 1),
                     "tail": tail if found else f"no {run_dir}/metrics.jsonl: the run's directory moved? {tail}"})
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", choices=("quickstart", *TESTS))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=0, help="busy processes running beside each run (default 0)")
    ap.add_argument("--steps", type=int, default=None, help="quickstart only: its --steps (default: its own)")
    args = parse(ap, {"what": "quickstart", "runs": 1, "steps": 4})
    if args.what is None:
        ap.error("say what to run: quickstart or one of " + ", ".join(TESTS))
    hogs = [mp.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    runs = []
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="aj-spread-") as tmp:
                rs = one_run(args.what, Path(tmp), steps=args.steps)
            runs += rs
            print(f"run {i + 1}/{args.runs}: {rs}", flush=True)
    finally:
        for h in hogs:
            h.kill()
    rows = [(f"{i // len(MODELS.get(args.what, (None,))) + 1}" + (f" {r['model']}" if r["model"] else ""),
             "yes" if r["ok"] else "NO", f"{100 * r['first']:.1f}%" if r["first"] is not None else "-",
             f"{100 * r['last']:.1f}%" if r["last"] is not None else "-",
             f"{100 * (r['last'] - r['first']):+.1f}" if r["last"] is not None else "-",
             f"{r['reward_gain']:+.3f}" if r.get("reward_gain") is not None else "-", f"{r['seconds']:.0f}")
            for i, r in enumerate(runs)]
    table(rows, ("run", "passed", "accuracy first", "accuracy last", "gain (points)", "reward gain", "seconds"))
    summary = {}
    for name in MODELS.get(args.what, (None,)):
        mine = [r for r in runs if r["model"] == name]
        summary[name or "all"] = one = {"runs": len(mine), "passed": sum(r["ok"] for r in mine)}
        done = [r for r in mine if r["last"] is not None]
        gains = [r["last"] - r["first"] for r in done]
        reward_gains = [r["reward_gain"] for r in mine if r.get("reward_gain") is not None]
        if reward_gains:
            one.update(reward_gain_min=min(reward_gains), reward_gain_max=max(reward_gains))
        if done:
            one.update(last_min=min(r["last"] for r in done), last_median=statistics.median(r["last"] for r in done),
                       last_max=max(r["last"] for r in done), gain_min=min(gains),
                       gain_median=statistics.median(gains), gain_max=max(gains))
            print(f"{name + ': ' if name else ''}last accuracy {100 * one['last_min']:.1f}% … "
                  f"{100 * one['last_max']:.1f}% (median {100 * one['last_median']:.1f}%); gain "
                  f"{100 * one['gain_min']:+.1f} … {100 * one['gain_max']:+.1f} points")
    if list(summary) == ["all"]:
        summary = summary["all"]      # the layout earlier results have
    write(f"spread_{args.what}" + (f"_load{args.load}" if args.load else ""),
          {"what": args.what, "load": args.load, "runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
