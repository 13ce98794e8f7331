"""RL throughput on a model of a real shape: ActorJet (asynchronous) against TRL's GRPOTrainer
(synchronous), both generating with transformers and training in float32.

    python bench/rl_throughput.py --device cuda                 # Qwen2.5-0.5B shape, 32 groups x 8, 256-token answers
    python bench/rl_throughput.py --smoke                       # the same paths on a CPU in a minute or two

The model is random-init (models/shapes.py: no weights travel to a lent GPU machine), written
once as a model directory with a tokenizer of its full vocabulary.  The work is agents/noise.py:
a random prompt, an answer of exactly ``--answer`` tokens at temperature 1 (its length comes
with the task; the end-of-sequence token of a random model is too rare to matter), rewarded by
the share of digits in its text, so GRPO groups are never all alike.  ActorJet runs the job on
an embedded head with ``--runners`` runner processes (the agent talks through the ``openai``
SDK; samples at most one weight version old); TRL runs GRPOTrainer in this machine's one
process: generate the batch, then train on it.  Same batch (``--groups`` x ``--group-size``),
lr, clip, loss (token mean), no KL.

  samples/s      sampled answers trained per second after the first ``--warmup`` steps
  s/step         the same as seconds per learner step
  ActorJet ÷ TRL samples/s ratio (issue 49's target: >= 1.3 on one H200)

Writes bench/results/LABEL.json (default rl_throughput-SHAPE-DEVICE).
"""
from __future__ import annotations

import argparse
import json
import os
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

from common import parse, table, write  # noqa: E402

LR = 1e-6


def rate(times: list[float], warmup: int, samples_per_step: int) -> dict:
    """Samples per second from the times each step ended (step k at times[k - 1])."""
    counted = times[warmup:]
    seconds = counted[-1] - times[warmup - 1] if warmup else counted[-1] - counted[0]
    steps = len(counted) if warmup else len(counted) - 1
    return {"samples_per_s": steps * samples_per_step / seconds, "s_per_step": seconds / steps,
            "step_times": times}


def trl_run(args, model_dir: str, out: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from actorjet_agents import noise

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    stream = noise.tasks(0, args.answer)
    rows = [next(stream) for _ in range(args.steps * args.groups)]
    data = Dataset.from_list([{"prompt": noise.messages(t)} for t in rows])

    def reward(completions, **_):
        return [noise.score({}, c[0]["content"]) for c in completions]

    ended: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **kw):
            ended.append(time.perf_counter())

    cfg = GRPOConfig(output_dir=str(out.parent / "trl-out"), per_device_train_batch_size=args.groups * args.group_size,
                     num_generations=args.group_size, max_completion_length=args.answer, learning_rate=LR, beta=0.0,
                     epsilon=0.2, loss_type="dapo", temperature=1.0, use_cpu=args.device == "cpu", bf16=False,
                     max_steps=args.steps, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                     logging_steps=10_000, report_to="none", save_strategy="no", seed=0, shuffle_dataset=False,
                     gradient_checkpointing=False, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()])
    trainer.train()
    out.write_text(json.dumps({"framework": "trl", **rate(ended, args.warmup, args.groups * args.group_size)}))


def actorjet_run(args, model_dir: str, out: Path) -> None:
    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.monitor import metrics
    from actorjet.runtime.head import Head
    from actorjet.runtime.system import free_port
    from actorjet.runtime.tree_spec import load_tree

    os.environ["ACTORJET_NOISE_TOKENS"] = str(args.answer)     # agents/noise.py: the runners inherit it
    spec = {"models": [{"name": "policy", "source": model_dir, "device": args.device, "lr": LR,
                        "max_batch": args.groups * args.group_size, "default_max_tokens": args.answer,
                        "checkpoint_every": 10 ** 6, "eval_every": 10 ** 6}],
            "tasks": [{"name": "noise", "source": "actorjet_agents.noise", "behavior": "actorjet_agents.noise:behavior"}],
            "train": {"group_size": args.group_size, "groups_per_step": args.groups, "steps": args.steps,
                      "max_staleness": 1, "seed": 0, "runner_concurrency": args.groups * args.group_size}}
    job = prepare(normalize(spec, "rl_throughput"))
    run = out.parent / "aj-run"
    head = Head(run, load_tree(tree_path("default.toml")), job, port=free_port(), slots=args.runners)
    head.start()
    try:
        deadline, follower = time.time() + args.timeout, metrics.Follower(run)
        while True:
            time.sleep(0.5)
            trains = [r for r in follower.read() if r.get("kind") == "train"]
            if len(trains) >= args.steps:
                break
            if time.time() > deadline:
                raise RuntimeError(f"ActorJet trained {len(trains)} of {args.steps} steps in {args.timeout} s")
    finally:
        head.stop()
    ended = [r["time"] for r in sorted(trains, key=lambda r: r["step"])]
    parts = {k: statistics.fmean(r[k] for r in trains[args.warmup:]) for k in ("batch_wait_s", "train_s", "publish_s")}
    out.write_text(json.dumps({"framework": "actorjet", "parts": parts,
                               **rate(ended, args.warmup, args.groups * args.group_size)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="a models/shapes.py shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--answer", type=int, default=256, help="tokens of every answer")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the rate")
    ap.add_argument("--runners", type=int, default=4, help="ActorJet runner processes")
    ap.add_argument("--only", choices=("actorjet", "trl"), default=None)
    ap.add_argument("--timeout", type=float, default=900, help="seconds each framework may take")
    ap.add_argument("--label", default="", help="the result file's name (default: rl_throughput-…)")
    args = parse(ap, {"shape": "tiny", "device": "cpu", "groups": 4, "group_size": 4, "answer": 16, "steps": 4,
                      "warmup": 1, "runners": 2})
    if args.steps <= args.warmup + 1:
        ap.error("--steps must exceed --warmup by 2 or more")
    import importlib.util

    if importlib.util.find_spec("trl") is None and args.only != "actorjet":
        print("bench/rl_throughput.py needs the `compare` extra: pip install -c constraints.txt -e '.[compare]'",
              file=sys.stderr)
        return 2
    from actorjet.models import shapes

    results = {}
    with tempfile.TemporaryDirectory(prefix="rl-throughput-") as tmp:
        model_dir = str(shapes.save("shape:" + args.shape, Path(tmp) / "model"))
        for fw in (["actorjet", "trl"] if args.only is None else [args.only]):
            out = Path(tmp) / fw / "result.json"
            out.parent.mkdir()
            t0 = time.time()
            child = [sys.executable, __file__, f"_{fw}", json.dumps(vars(args)), model_dir, str(out)]
            proc = subprocess.run(child, cwd=REPO, capture_output=True, text=True, timeout=args.timeout + 300)
            if proc.returncode != 0 or not out.exists():
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"{fw} failed")
            results[fw] = json.loads(out.read_text())
            print(f"{fw}: {results[fw]['samples_per_s']:.1f} samples/s ({time.time() - t0:.0f} s in all)", flush=True)
    rows = [(fw, args.shape, args.device, f"{r['samples_per_s']:.1f}", f"{r['s_per_step']:.2f}")
            for fw, r in results.items()]
    table(rows, ("framework", "shape", "device", "samples/s", "s/step"))
    summary = {"args": vars(args), **results}
    if len(results) == 2:
        summary["actorjet_over_trl"] = results["actorjet"]["samples_per_s"] / results["trl"]["samples_per_s"]
        print(f"ActorJet ÷ TRL samples/s: {summary['actorjet_over_trl']:.2f} (target ≥ 1.3)")
    label = f"{args.shape}-{args.device}"
    write(args.label or f"rl_throughput-{label}", summary)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["_trl"], ["_actorjet"]):
        run_args = argparse.Namespace(**json.loads(sys.argv[2]))
        (trl_run if sys.argv[1] == "_trl" else actorjet_run)(run_args, sys.argv[3], Path(sys.argv[4]))
    else:
        sys.exit(main())
