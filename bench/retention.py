"""Does the episode store stay bounded over a long run?  The quickstart's job, for many steps.

    python bench/retention.py [--steps 2000] [--checkpoint-every 50]

Runs the quickstart job (tiny-arith, 32 groups of 8 a step, the real swarm: embedded head,
two runner processes) with a checkpoint — and so retention — every ``--checkpoint-every``
steps, and samples the model's episode store on disk (the SQLite file and its WAL) as the
learner's step grows.  At the end it checks that nothing was lost: every complete group is
trained (retired included), pending or quarantined.  Prints a table, writes
bench/results/retention.json and plots/retention.png next to it.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import RESULTS, parse, result_name, start_head, table, write  # noqa: E402

from actorjet.cli.train_cmds import QUICKSTART_JOB  # noqa: E402


def store_bytes(run: Path) -> int:
    return sum(p.stat().st_size for p in run.rglob("episodes-policy.sqlite*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="learner steps (default %(default)s)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default %(default)s)")
    ap.add_argument("--early", type=int, default=200, help="the step compared with the last (default %(default)s)")
    args = parse(ap, {"steps": 8, "checkpoint_every": 2, "early": 4})     # four retentions
    if args.steps < 2 or not 1 <= args.checkpoint_every <= args.steps or not 1 <= args.early < args.steps:
        ap.error("need --steps >= 2, 1 <= --checkpoint-every <= --steps and 1 <= --early < --steps")
    job = {**QUICKSTART_JOB, "models": [dict(QUICKSTART_JOB["models"][0], checkpoint_every=args.checkpoint_every,
                                             eval_every=max(10, args.steps // 10))],
           "train": dict(QUICKSTART_JOB["train"], steps=args.steps)}
    run = Path(tempfile.mkdtemp(prefix="retention-")) / "run"
    head = start_head(run, job, slots=2)
    series, t0, last = [], time.time(), -1
    every = max(1, min(10, args.steps // 10))          # store samples: every 10 steps of a long run
    try:
        while True:
            status = head.status()
            step = max((m.get("learner_step") or 0 for m in status.get("models", [])), default=0)
            if step != last and (step % every == 0 or step >= args.steps):
                series.append({"step": step, "bytes": store_bytes(run), "seconds": round(time.time() - t0, 1)})
                last = step
                print(f"step {step}: store {series[-1]['bytes'] / 1e6:.2f} MB", flush=True)
            if status.get("training_finished") or step >= args.steps:
                break
            if time.time() - t0 > 6 * 3600:
                raise SystemExit("gave up after 6 hours")
            time.sleep(0.5)
        groups = head.status()["groups"]
        owed = groups["issued"] - groups["dropped"] - groups["groups_open"]    # must be complete in the store
    finally:
        head.stop()
    from actorjet.store.episode_store import EpisodeStore
    store = EpisodeStore(next(run.rglob("episodes-policy.sqlite")))
    counts = store.counts()              # retired groups included
    store.close_db()
    early = min(series, key=lambda r: abs(r["step"] - args.early))
    final = series[-1]
    peak = max(r["bytes"] for r in series if r["step"] >= early["step"])
    # nothing lost: every group the registry issued and neither dropped nor left open is
    # complete in the store; nothing trained twice: exactly groups_per_step groups a step
    per_step = job["train"]["groups_per_step"]
    ok = counts["complete"] >= owed and counts["trained"] == per_step * final["step"]
    table([(r["step"], f"{r['bytes'] / 1e6:.2f}") for r in series[::max(1, len(series) // 12)] + [final]],
          ("step", "store MB"))
    print(f"store at step {final['step']} / at step {early['step']}: {final['bytes'] / early['bytes']:.2f} "
          f"(peak after it: {peak / early['bytes']:.2f}); store counts {counts}; registry issued, not dropped or open {owed}; "
          f"trained = {per_step} x steps: {counts['trained'] == per_step * final['step']}; nothing lost: {bool(ok)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.plot([r["step"] for r in series], [r["bytes"] / 1e6 for r in series])
        ax.set_xlabel("learner step")
        ax.set_ylabel("episode store, MB")
        ax.set_title(f"quickstart job, retention every {args.checkpoint_every} steps")
        fig.tight_layout()
        (RESULTS / "plots").mkdir(parents=True, exist_ok=True)
        fig.savefig(RESULTS / "plots" / f"{result_name('retention')}.png", dpi=100)
    except ImportError:
        pass
    write("retention", {"steps": args.steps, "checkpoint_every": args.checkpoint_every, "series": series,
                        "ratio_final_to_early": final["bytes"] / early["bytes"], "early_step": early["step"],
                        "peak_ratio_after_early": peak / early["bytes"], "counts": counts,
                        "registry_issued_not_dropped_or_open": owed, "nothing_lost": bool(ok),
                        "command": f"python bench/retention.py --steps {args.steps} "
                                   f"--checkpoint-every {args.checkpoint_every}"})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
