"""`actorjet quickstart`: the whole swarm on one machine, training tiny-arith on addition.

An embedded head (registry, engine, gateway, learner) plus runner processes on
the head's own slots.  The agent (agents/arithmetic.py) talks to the gateway through the
`openai` SDK exactly as it would to any OpenAI-compatible server.
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

QUICKSTART_JOB = {
    "models": [{"name": "policy", "source": "tiny-arith", "lr": 1e-4, "eval_every": 10,
                "checkpoint_every": 1000, "max_batch": 256}],
    "tasks": [{"name": "arithmetic", "source": "actorjet_agents.arithmetic", "behavior": "actorjet_agents.arithmetic:behavior"}],
    "train": {"group_size": 8, "groups_per_step": 32, "steps": 150, "max_staleness": 1, "seed": 0,
              "runner_concurrency": 64},
}


def add_quickstart(sub) -> None:
    p = sub.add_parser("quickstart", help="train the tiny arithmetic model on this machine (~2–4 min on 2 cores)",
                       description="Start an embedded head and local runner processes, train tiny-arith "
                       "(a 1M-parameter Llama warmed up on 2-digit addition) with GRPO through the "
                       "OpenAI-compatible gateway, and print held-out accuracy before and after.")
    p.add_argument("--steps", type=int, default=QUICKSTART_JOB["train"]["steps"], help="learner steps (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the warm-up and of training (default 0)")
    p.add_argument("--warmup-seed", type=int, default=None, help="seed of the tiny-arith warm-up alone (default: "
                   "--seed); e.g. --warmup-seed 0 --seed 3 trains the shipped checkpoint with training seed 3")
    p.add_argument("--runners", type=int, default=2, help="local runner processes (default 2)")
    p.add_argument("--algorithm", default="grpo", help="grpo | dr_grpo | rloo | reinforce_pp | gspo | ppo, with "
                   "each one's published defaults (docs/algorithms.md; default %(default)s)")
    p.add_argument("--run-dir", default=None, help="run directory (default runs/quickstart-TIMESTAMP)")
    p.add_argument("--port", type=int, default=0, help="head port (default: a free one)")
    p.set_defaults(func=cmd_quickstart)


def cmd_quickstart(args) -> int:
    import copy

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from actorjet.monitor import metrics
    from actorjet.errors import UserError
    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import build_model, prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.tree_spec import load_tree
    from actorjet.runtime.system import free_port

    if args.steps < 1 or args.runners < 1:
        raise UserError("--steps and --runners must be >= 1")
    console = Console()
    started = time.time()
    spec = copy.deepcopy(QUICKSTART_JOB)
    spec["train"].update(steps=args.steps, seed=args.seed)
    spec["models"][0]["algorithm"] = args.algorithm
    job = normalize(spec, "quickstart")
    run_dir = Path(args.run_dir or f"runs/quickstart-{datetime.now():%Y%m%d-%H%M%S}")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        warm = bar.add_task("warm-up of tiny-arith (once per seed)", total=300)
        progress = lambda done, total: bar.update(warm, completed=done, total=total)  # noqa: E731
        if args.warmup_seed is not None:          # the model of that warm-up, trained with --seed
            job["models"][0]["source"] = build_model("tiny-arith", args.warmup_seed, progress)
        prepare(job, progress=progress)
    head = Head(run_dir, load_tree(tree_path("default.toml")), job, port=args.port or free_port(),
                slots=args.runners)
    console.print(f"run directory: [bold]{run_dir.resolve()}[/bold]")
    head.start()
    try:
        _train(head, run_dir, args.steps, console, Progress, BarColumn, TextColumn, TimeElapsedColumn)
    finally:
        head.stop()
    evals = [r for r in metrics.read(run_dir) if r.get("kind") == "eval"]
    plot = metrics.plot(run_dir)
    if len(evals) < 2:
        raise UserError(f"training ended without a final evaluation; see {run_dir / 'logs'}")
    before, after = evals[0]["accuracy"], evals[-1]["accuracy"]
    console.print(f"held-out greedy accuracy (512 problems): [bold]{before:.1%}[/bold] before → "
                  f"[bold green]{after:.1%}[/bold green] after {evals[-1]['step']} steps "
                  f"({after - before:+.1%})")
    from actorjet.monitor import report
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}   plot: {plot}")
    console.print(f"report: {report.build(run_dir)}")
    console.print(f"wall time: {time.time() - started:.0f} s")
    return 0


def _train(head, run_dir, steps, console, Progress, BarColumn, TextColumn, TimeElapsedColumn) -> None:
    from actorjet.monitor import metrics
    from actorjet.errors import UserError
    from actorjet.runtime import messages as m

    with Progress(TextColumn("training"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("train", total=steps, info="starting the swarm…")
        last_change, last_step = time.time(), -1
        follower = metrics.Follower(run_dir)
        while True:
            msg = head.poll(0.5)
            if isinstance(msg, m.Escalated) and msg.path == "root":
                raise UserError(f"the supervisor tree gave up: {msg.reason}")
            rows = follower.read()
            train = [r for r in rows if r.get("kind") == "train"]
            evals = [r for r in rows if r.get("kind") == "eval"]
            step = train[-1]["step"] if train else 0
            if step != last_step:
                last_step, last_change = step, time.time()
            info = ""
            if train:
                info = f"reward {train[-1]['reward_mean']:.2f}"
            if evals:
                info += f"  held-out acc {evals[-1]['accuracy']:.1%}"
            bar.update(task, completed=step, info=info)
            if step >= steps and evals and evals[-1]["step"] >= steps:
                return
            if time.time() - last_change > 120:
                raise UserError(f"no learner step for 120 s; see {run_dir / 'logs'}")
