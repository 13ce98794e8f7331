"""What it costs to keep a model's episodes: the episode store's writes, per episode.

    python bench/store.py [--groups 400]                 # this checkout: the episode store
    PYTHONPATH=OLD python bench/store.py --before        # a checkout of dc8dab8: gateway memory + ledger

One GRPO group = 8 episodes of one call each (a quickstart-sized record: 40 prompt ids,
8 completion ids, messages).  CPU seconds on one core, no HTTP (the HTTP legs are in
bench/overhead.py's per-process CPU):

  after   the gateway writes each call (one transaction per event-loop turn: ``--turn``
          calls, default 16) and each group's rewards (one transaction), then the learner
          claims the groups (``take``, 32 per batch) and reads them back;
  before  the gateway keeps calls in memory; the merger collects them (the records as the
          HTTP body's JSON, both ways), commits them with the rewards to the ledger, releases
          them, builds a batch from the ledger (assign) and the learner claims it.

The last column says how many episodes per second one core could keep at that cost: where
one store (one writer) becomes the limit.  Writes bench/results/store[-before].json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse, table, write  # noqa: E402

from actorjet.store.records import CallRecord  # noqa: E402

GROUP = 8


def records(group: int) -> list:
    return [CallRecord(f"g{group}.{k}", "policy", "default", 0, 0, list(range(100, 140)), list(range(8)),
                       [-0.5] * 8, 3, 1.0, [{"role": "user", "content": "12+34="}], None,
                       {"temperature": 1.0, "top_p": 1.0, "n": 1, "stop": [], "seed": None}, "stop")
            for k in range(GROUP)]


def per_episode(marks: tuple, episodes: int) -> dict:
    """CPU µs per episode of each phase, from the process-time marks between them."""
    t0, t_calls, t_results, t_take = marks
    return {"calls_us_per_episode": (t_calls - t0) / episodes * 1e6,
            "results_us_per_episode": (t_results - t_calls) / episodes * 1e6,
            "claim_us_per_episode": (t_take - t_results) / episodes * 1e6,
            "total_us_per_episode": (t_take - t0) / episodes * 1e6}


def after(tmp: Path, groups: int, turn: int) -> dict:
    from actorjet.store.episode_store import EpisodeStore

    gateway, learner = EpisodeStore(tmp / "s.sqlite"), EpisodeStore(tmp / "s.sqlite")
    all_records = [r for g in range(groups) for r in records(g)]
    t0 = time.process_time()
    for i in range(0, len(all_records), turn):
        gateway.add(all_records[i:i + turn])
        gateway.flush()
    t_calls = time.process_time()
    for g in range(groups):
        gateway.put_results({"group_id": f"g{g}", "size": GROUP, "task_name": "t", "behavior": "b", "version": 1},
                            [{"episode_id": f"g{g}.{k}", "member": k, "reward": float(k % 2)} for k in range(GROUP)])
    t_results = time.process_time()
    step = 0
    while True:
        taken = learner.take({}, 32)
        if not taken:
            break
        step += 1
        learner.trained([g["group_id"] for g in taken], step)
    return per_episode((t0, t_calls, t_results, time.process_time()), groups * GROUP)


def before(tmp: Path, groups: int) -> dict:
    from actorjet.ledger import Ledger
    from actorjet.store.records import CallStore

    gateway, ledger = CallStore(), Ledger(tmp)
    t0 = time.process_time()
    for g in range(groups):
        gateway.add(records(g))
    t_calls = time.process_time()
    for g in range(groups):
        ids = [f"g{g}.{k}" for k in range(GROUP)]
        body = json.dumps(gateway.collect(ids, close=False))           # the gateway answers /internal/collect
        calls = json.loads(body)                                       # the merger reads it
        group = {"group_id": f"g{g}", "task_name": "t", "behavior": "b", "version": 1,
                 "episodes": [{"episode_id": e, "reward": float(k % 2)} for k, e in enumerate(ids)]}
        ledger.store_many([(group, {"policy": calls})])
        gateway.collect(ids, close=True, read=False)                   # release
    t_results = time.process_time()
    step = 0
    while ledger.count_pending("policy"):
        batch = ledger.pending("policy", 32)
        ids = [b["group_id"] for b in batch]
        step += 1
        ledger.assign("policy", ids, f"b{step}")
        ledger.claim("policy", ids, step)
    return per_episode((t0, t_calls, t_results, time.process_time()), groups * GROUP)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--turn", type=int, default=16, help="calls written per gateway event-loop turn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", action="store_true", help="measure the old path (run against a dc8dab8 checkout)")
    args = parse(ap, {"groups": 20, "repeats": 1})
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(before(Path(tmp), args.groups) if args.before else after(Path(tmp), args.groups, args.turn))
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    label = "gateway memory + merger + ledger" if args.before else f"episode store ({args.turn} calls per write)"
    rows = [(label + ": " + k.removesuffix("_us_per_episode"), f"{v:.0f}", f"{1e6 / v:,.0f}")
            for k, v in best.items()]
    table(rows, ("CPU per episode (min of runs)", "µs", "episodes/s on one core"))
    write("store-before" if args.before else "store",
          {"groups": args.groups, "group_size": GROUP, "turn": args.turn, "repeats": args.repeats,
           "best": best, "runs": runs, "episodes_per_s_one_core": 1e6 / best["total_us_per_episode"]})


if __name__ == "__main__":
    main()
