"""ActorJet against TRL's GRPOTrainer on the quickstart's exact work, side by side.

    pip install -c constraints.txt -e '.[compare]'       # trl and datasets
    python bench/vs_trl.py [--seeds 3] [--steps 150] [--only actorjet|trl] [--runners 2] [--concurrency 64]
                           [--agent sdk|http] [--device cpu|cuda]

The work: the shipped tiny-arith checkpoint (seed 0 for both; a seed varies training only),
chat-templated prompts from agents/arithmetic.py, 32 groups × 8 samples per step, lr 1e-4,
4 new tokens at temperature 1, clip 0.2, token-mean loss (TRL's ``dapo``), no KL, AdamW
without weight decay, grad-norm clip 1.0, constant lr.  ActorJet runs the quickstart's job
(2 runners, the agent talks through the ``openai`` SDK; asynchronous, samples at most one
weight version old); TRL runs GRPOTrainer on the CPU (on-policy: generate, then train).
``--agent http`` runs agents/arithmetic_http.py instead, the same task over plain HTTP: on
a 2-core machine the SDK's ~2 ms of CPU a call competes with the server for the same cores,
so this separates what the framework costs from what the agent's client costs.
Both train in float32: TRL's GRPOConfig defaults to ``bf16=True`` (autocast), which is other
numerics than ActorJet's float32 learner, and on a CPU without bf16 instructions (this AMD
EPYC: AVX2 only) made TRL's step 4.2 s instead of 0.49 s, so it is set off here.

Neither evaluates while it trains: both keep a snapshot of the weights every 2 steps, and
after the run every snapshot is scored with ActorJet's own evaluator (greedy, the 512
validation problems).  ActorJet's learner would score its starting weights while its first
steps train (the quickstart's "before"); here it is told not to (``eval_at_start = false``):
the bench scores step 0 itself, as it does TRL's.  The clock is wall time from the start of
training, with the snapshots' cost taken off: TRL's from ``on_train_begin`` less its
(in-memory) snapshot copies; ActorJet's from its first lease (rollouts have begun; the
learner may still be loading, which stays on its clock) less its checkpoint writes.

Runs alternate framework order per seed (interleaved rounds), each in its own process.
Prints time to 50/55/60% held-out accuracy, final accuracy, accuracy at equal wall time,
s/step (overall, after the warm-up of ``--warmup`` steps, 10, and the time to its end), the
steps each needed to 55%, CPU-seconds per step after the warm-up (TRL: its process, all
threads; ActorJet: every process of the run, by actor), and where ActorJet's step time goes,
with medians and 95% t intervals over seeds; writes bench/results/vs_trl.json (other --only/--runners/--concurrency/--steps:
a file named after them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from common import cpu_seconds, interval, parse, table, write  # noqa: E402

THRESHOLDS = (0.50, 0.55, 0.60)
SNAPSHOT_EVERY = 2
GROUPS, GROUP_SIZE, LR, MAX_TOKENS = 32, 8, 1e-4, 4


# -- TRL -----------------------------------------------------------------------------------------
def trl_run(seed: int, steps: int, out: Path, device: str = "cpu") -> None:
    """GRPOTrainer on ``device``; a callback copies the weights every SNAPSHOT_EVERY steps (off
    the clock), scored after the run."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from actorjet.models import zoo
    from actorjet.models.evaluate import greedy_accuracy
    from actorjet.models.heldout import eval_spec
    from actorjet_agents import arithmetic

    torch.manual_seed(seed)
    path = zoo.resolve("tiny-arith", 0)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    stream = arithmetic.tasks(seed)
    rows = [next(stream) for _ in range(steps * GROUPS)]
    data = Dataset.from_list([{"prompt": arithmetic.messages(t), "answer": t["answer"]} for t in rows])
    spec = eval_spec("actorjet_agents.arithmetic", "policy")

    def reward(completions, answer, **_):
        return [arithmetic.score({"answer": a}, c[0]["content"]) for c, a in zip(completions, answer)]

    snapshots, clock = [], {"t0": None, "copy_s": 0.0, "cpu0": None, "copy_cpu_s": 0.0}

    def snapshot(step: int, now: float) -> None:
        snapshots.append((step, now, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}))

    class Snapshot(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            snapshot(0, 0.0)
            clock["t0"], clock["cpu0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % SNAPSHOT_EVERY and state.global_step != steps:
                return
            start, cpu = time.perf_counter(), time.process_time()
            snapshot(state.global_step, start - clock["t0"] - clock["copy_s"])
            clock["copy_s"] += time.perf_counter() - start
            clock["copy_cpu_s"] += time.process_time() - cpu

    cfg = GRPOConfig(output_dir=str(out.parent / "trl-out"), per_device_train_batch_size=GROUPS * GROUP_SIZE,
                     num_generations=GROUP_SIZE, max_completion_length=MAX_TOKENS, learning_rate=LR, beta=0.0,
                     epsilon=0.2, loss_type="dapo", temperature=1.0, use_cpu=device == "cpu", bf16=False,
                     max_steps=steps,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                     logging_steps=10_000, report_to="none", save_strategy="no", seed=seed, shuffle_dataset=False,
                     gradient_checkpointing=False, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[Snapshot()])
    wall0 = time.perf_counter()
    trainer.train()
    train_clock = time.perf_counter() - clock["t0"] - clock["copy_s"]
    cpu = {"trl": (time.process_time() - clock["cpu0"] - clock["copy_cpu_s"]) / steps}   # all its threads
    curve = []
    model = model.to("cpu")
    for step, at, weights in snapshots:
        model.load_state_dict(weights)
        curve.append({"step": step, "clock_s": at, "accuracy": greedy_accuracy(model, tok, spec)})
    out.write_text(json.dumps({"framework": "trl", "seed": seed, "curve": curve, "train_clock_s": train_clock,
                               "wall_s": time.perf_counter() - wall0, "cpu_s_per_step": cpu}))


# -- ActorJet ------------------------------------------------------------------------------------
HTTP_AGENT = "actorjet_agents.arithmetic_http:behavior"     # --agent http: the quickstart's task, no SDK


def actorjet_run(seed: int, steps: int, out: Path, runners: int = 2, concurrency: int = 64,
                 device: str = "cpu", agent: str = "sdk", warmup: int = 10) -> None:
    """The quickstart's job on an embedded head (the model built from seed 0, training seed
    ``seed``, a checkpoint every SNAPSHOT_EVERY steps, every one kept, no periodic evaluation),
    until the last step is trained; then every checkpoint is scored.  The clock starts at the
    first lease (rollouts began) and the learner's checkpoint writes are taken off it, as
    TRL's snapshot copies are off TRL's."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actorjet.monitor import metrics
    from actorjet.cli.train_cmds import QUICKSTART_JOB
    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.tree_spec import load_tree
    from actorjet.runtime.system import free_port
    from actorjet.models.evaluate import greedy_accuracy
    from actorjet.models.heldout import eval_spec

    spec = copy.deepcopy(QUICKSTART_JOB)
    spec["train"].update(steps=steps, seed=0)
    spec["models"][0].update(checkpoint_every=SNAPSHOT_EVERY, eval_every=10 * steps, eval_at_start=False,
                             device=device, checkpoint_keep_last=10 ** 6, checkpoint_keep_best=0)
    spec["train"]["runner_concurrency"] = concurrency
    if agent == "http":
        spec["tasks"][0]["behavior"] = HTTP_AGENT
    job = prepare(normalize(spec, "vs_trl"))
    job["train"]["seed"] = seed
    run = out.parent / "aj-run"
    head = Head(run, load_tree(tree_path("default.toml")), job, port=free_port(), slots=runners)
    wall0 = time.perf_counter()
    head.start()
    try:
        cpu_from, follower = None, metrics.Follower(run)
        while True:
            time.sleep(0.5)
            rows = follower.read()
            trained = max((r["step"] for r in rows if r.get("kind") == "train"), default=0)
            if cpu_from is None and trained >= warmup:
                roles = process_roles(head, str(out))
                cpu_from = (trained, cpu_seconds({pid: pid for pid in roles}))
            if trained >= steps:
                break
            if time.perf_counter() - wall0 > 1800:
                raise RuntimeError("ActorJet did not finish in 30 min")
        first_lease = head.status()["groups"]["first_lease_at"]
        cpu_to = cpu_seconds({pid: pid for pid in roles})
    finally:
        head.stop()
    trains = {r["step"]: r for r in rows if r.get("kind") == "train"}
    t0 = first_lease                               # rollouts began
    written = {r["step"]: r["checkpoint_s"] for r in rows if r.get("kind") == "checkpoint"}

    def clock(step: int) -> float:
        """Seconds of training to ``step``, less the checkpoints written before it."""
        return trains[step]["time"] - t0 - sum(s for k, s in written.items() if k < step)

    start = job["models"][0]["path"]
    model, tok = AutoModelForCausalLM.from_pretrained(start), AutoTokenizer.from_pretrained(start)
    score = eval_spec("actorjet_agents.arithmetic", "policy")
    curve = [{"step": 0, "clock_s": 0.0, "accuracy": greedy_accuracy(model, tok, score)}]
    for ckpt in sorted((run / "checkpoints" / "policy").glob("step_*")):
        step = int(ckpt.name.split("_")[1])
        model = AutoModelForCausalLM.from_pretrained(ckpt)
        curve.append({"step": step, "clock_s": clock(step), "accuracy": greedy_accuracy(model, tok, score)})
    parts = {k: statistics.fmean(r[k] for r in trains.values()) for k in ("batch_wait_s", "train_s", "publish_s",
                                                                          "step_time_s")}
    # CPU per step by role, from the poll that saw step ``warmup`` to the one that saw the last
    # (a poll may see a step or two late: the window is the steps between the two polls' sightings)
    n = max(1, trained - cpu_from[0])
    cpu = {}
    for pid, seconds in cpu_to.items():
        role = roles[pid]
        cpu[role] = cpu.get(role, 0.0) + (seconds - cpu_from[1].get(pid, 0.0)) / n
    out.write_text(json.dumps({"framework": "actorjet", "seed": seed, "curve": curve,
                               "critical_path": critical_path(rows, warmup),
                               "train_clock_s": clock(steps), "wall_s": time.perf_counter() - wall0,
                               "checkpoint_s": sum(written.values()),
                               "first_step_s": trains[1]["time"] - t0, "parts": parts,
                               "cpu_s_per_step": cpu}))


def critical_path(rows: list[dict], warmup: int) -> dict:
    """The step timeline of the median step (actorjet/monitor/timeline.py): its critical path,
    the median of each segment, and how many trained episodes lack a stage or are out of order."""
    from actorjet.monitor import timeline

    steps = timeline.steps(rows)
    step = timeline.median_step(steps, skip=warmup)
    if step is None:
        return {}
    return {"step": step.step, "period_s": step.period, "segments": timeline.critical_path(step),
            "medians": timeline.stage_medians(step), "lines": timeline.describe(step),
            "problems": sum(len(timeline.problems(s)) for s in steps)}


def process_roles(head, marker: str) -> dict[int, str]:
    """pid → role for every process of this ActorJet run: its actors by their tree path, and
    the rest (this process, thespian's admin and logger: forks, they share this process's
    command line, which names this run's own temporary directory) as "head & admin"."""
    import psutil

    by_path = {a["pid"]: a["path"].rsplit("/", 1)[-1] for a in head.status()["actors"]}
    roles = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if marker not in " ".join(proc.info["cmdline"] or []):
            continue
        name = by_path.get(proc.info["pid"], "")
        roles[proc.info["pid"]] = ("runners" if name.startswith("runner-") else
                                   name if name in ("engine", "gateway", "learner", "registry") else "head & admin")
    return roles


# -- comparison ----------------------------------------------------------------------------------
def steady(curve: list[dict], after: int) -> float:
    """Seconds per step once running (from step ``after`` to the end): startup left out."""
    first = next(p for p in curve if p["step"] >= after)
    return (curve[-1]["clock_s"] - first["clock_s"]) / max(1, curve[-1]["step"] - first["step"])


def time_to(curve: list[dict], threshold: float) -> float | None:
    return next((p["clock_s"] for p in curve if p["accuracy"] >= threshold), None)


def steps_to(curve: list[dict], threshold: float) -> int | None:
    return next((p["step"] for p in curve if p["accuracy"] >= threshold), None)


def accuracy_at(curve: list[dict], clock_s: float) -> float:
    """Held-out accuracy of the last evaluation at or before ``clock_s`` (the start's, step 0,
    if none: every curve begins there)."""
    before = [p["accuracy"] for p in curve if p["clock_s"] <= clock_s + 1e-9]
    return before[-1] if before else curve[0]["accuracy"]


def ci(values: list[float], digits: int = 1) -> str:
    return interval(values, f".{digits}f", centre="median")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--only", choices=("actorjet", "trl"), default=None, help="run one framework (profiling)")
    ap.add_argument("--runners", type=int, default=2, help="ActorJet runner processes (the quickstart's 2)")
    ap.add_argument("--concurrency", type=int, default=64, help="ActorJet episodes in flight per runner (64)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where both frameworks run their models")
    ap.add_argument("--agent", choices=("sdk", "http"), default="sdk",
                    help="ActorJet's agent: sdk (the quickstart's, through the openai SDK: ~2 ms of CPU a call "
                    "on the cores the server uses) or http (agents/arithmetic_http.py, the same task over plain "
                    "HTTP: what the framework costs without the SDK)")
    ap.add_argument("--label", default="", help="the result file's name (default: from the options)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="steps left out of s/step and CPU per step: startup (model loading, spawning) (10)")
    # (the smoke: 4 steps of each, the whole path, at a third of 12 steps' CPU)
    args = parse(ap, {"seeds": 1, "steps": 4, "warmup": 2})
    if args.seeds < 1 or args.runners < 1 or args.concurrency < 1 or args.warmup < 1:
        ap.error("--seeds, --runners, --concurrency and --warmup must be >= 1")
    if args.steps < args.warmup + 2:
        ap.error(f"--steps must be >= {args.warmup + 2}: s/step and CPU are counted after step {args.warmup} "
                 "(--warmup)")
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print("bench/vs_trl.py needs the `compare` extra: pip install -c constraints.txt -e '.[compare]'",
              file=sys.stderr)
        return 2
    runs = []
    for i, seed in enumerate(range(args.seeds)):
        order = ["actorjet", "trl"] if i % 2 == 0 else ["trl", "actorjet"]
        for fw in order if args.only is None else [args.only]:
            with tempfile.TemporaryDirectory(prefix=f"vs-{fw}-") as tmp:
                out = Path(tmp) / "result.json"
                t0 = time.time()
                knobs = [str(args.runners), str(args.concurrency)] if fw == "actorjet" else []
                knobs.append(args.device)
                knobs += [args.agent, str(args.warmup)] if fw == "actorjet" else []
                child = [sys.executable, __file__, f"_{fw}", str(seed), str(args.steps), str(out), *knobs]
                proc = subprocess.run(child,
                                      cwd=REPO, capture_output=True, text=True, timeout=3600)
                if proc.returncode != 0 or not out.exists():
                    print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{fw} seed {seed} failed")
                result = json.loads(out.read_text())
            runs.append(result)
            last = result["curve"][-1]
            result["steady_s_per_step"] = steady(result["curve"], args.warmup)
            print(f"{fw:9s} seed {seed}: {last['accuracy']:.1%} after {last['step']} steps, "
                  f"{result['train_clock_s']:.1f} s of training, {result['steady_s_per_step']:.3f} s/step after "
                  f"step {args.warmup} ({time.time() - t0:.0f} s in all)", flush=True)
            if result.get("critical_path"):
                print("\n".join(result["critical_path"]["lines"]), flush=True)
    summary = summarize(runs, args.steps, args.warmup)
    name = "vs_trl" if args.only is None and (args.runners, args.concurrency, args.steps) == (2, 64, 150) else \
        f"vs_trl-{args.only or 'both'}-r{args.runners}c{args.concurrency}-{args.steps}steps"
    name += "" if args.device == "cpu" else f"-{args.device}"
    name += "" if args.agent == "sdk" else f"-{args.agent}-agent"
    name = args.label or name
    write(name, {"steps": args.steps, "warmup": args.warmup, "seeds": args.seeds, "runners": args.runners,
                 "concurrency": args.concurrency,
                 "device": args.device, "agent": args.agent,
                 "runs": runs, "summary": summary})
    return 0


def summarize(runs: list[dict], steps: int, warmup: int) -> dict:
    by = {fw: [r for r in runs if r["framework"] == fw] for fw in ("actorjet", "trl")}
    by = {fw: rs for fw, rs in by.items() if rs}
    equal = min(r["train_clock_s"] for r in runs)          # wall time both reached in every run
    rows, summary = [], {}
    for fw, rs in by.items():
        s = {f"time_to_{int(x * 100)}": [time_to(r["curve"], x) for r in rs] for x in THRESHOLDS}
        s["final_accuracy"] = [r["curve"][-1]["accuracy"] for r in rs]
        s["accuracy_at_equal_time"] = [accuracy_at(r["curve"], equal) for r in rs]
        s["s_per_step"] = [r["train_clock_s"] / steps for r in rs]
        s["steady_s_per_step"] = [r["steady_s_per_step"] for r in rs]
        s["warmup_s"] = [next(p["clock_s"] for p in r["curve"] if p["step"] >= warmup) for r in rs]
        s["steps_to_55"] = [steps_to(r["curve"], 0.55) for r in rs]
        s["cpu_s_per_step"] = [sum(r["cpu_s_per_step"].values()) for r in rs]
        s["cpu_by_role"] = {role: [r["cpu_s_per_step"].get(role, 0.0) for r in rs]
                            for role in sorted({k for r in rs for k in r["cpu_s_per_step"]})}
        summary[fw] = s
        rows.append((fw, *(ci(s[f"time_to_{int(x * 100)}"]) for x in THRESHOLDS),
                     ci([100 * a for a in s["final_accuracy"]]), ci([100 * a for a in s["accuracy_at_equal_time"]]),
                     f"{statistics.median(s['s_per_step']):.3f}", f"{statistics.median(s['steady_s_per_step']):.3f}",
                     f"{statistics.median(s['warmup_s']):.1f}", ci(s["steps_to_55"])))
    summary["equal_time_s"] = equal
    table(rows, ("framework", "s to 50%", "s to 55%", "s to 60%", f"final % ({steps} steps)",
                 f"% at {equal:.0f} s", "s/step", f"s/step after {warmup}", f"s to step {warmup}", "steps to 55%"))
    if "actorjet" in by and "trl" in by:
        ratio = [a / b for a, b in zip(summary["actorjet"]["time_to_55"], summary["trl"]["time_to_55"])
                 if a is not None and b is not None]
        summary["time_to_55_ratio"] = ratio
        print(f"ActorJet time to 55% / TRL's, per seed: {', '.join(f'{r:.2f}' for r in ratio)} "
              f"(median {statistics.median(ratio):.2f}; target ≤ 0.8)" if ratio else "55% not reached by both")
    cpu_rows = [("actorjet", role, ci(values, 3), "")
                for role, values in summary.get("actorjet", {}).get("cpu_by_role", {}).items()]
    for fw in by:
        s = summary[fw]
        total = statistics.median(s["cpu_s_per_step"])
        cpu_rows.append((fw, "all", ci(s["cpu_s_per_step"], 3),
                         f"{total / statistics.median(s['steady_s_per_step']):.2f}"))
    print(f"CPU-s per step after step {warmup} (median [95% CI] over seeds); cores busy = CPU-s ÷ s/step:")
    table(cpu_rows, ("framework", "where", "CPU-s/step", "cores busy"))
    if "actorjet" in by:
        parts = {k: statistics.fmean(r["parts"][k] for r in by["actorjet"]) for k in by["actorjet"][0]["parts"]}
        summary["actorjet_step_parts"] = parts
        print("ActorJet step time: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))
    return summary


if __name__ == "__main__":
    if sys.argv[1:2] == ["_trl"]:
        trl_run(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
    elif sys.argv[1:2] == ["_actorjet"]:
        actorjet_run(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                     sys.argv[7], sys.argv[8], int(sys.argv[9]))
    else:
        sys.exit(main())
