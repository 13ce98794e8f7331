"""Swarm overhead: one RL step through the swarm vs the same step in one process.

    python bench/overhead.py [--steps 30] [--model tiny-arith]

Swarm:    embedded head + 2 runner processes; the agent (agents/arithmetic.py) calls the
          gateway with the openai SDK; merger → learner; steady-state seconds per step.
Baseline: one process, same model, batch (groups × 8), task, learning rate and seed:
          direct batched sampling with the learner's own weights, rewards, GRPO step.
Target:   swarm step ≤ 1.5x the baseline step.  Writes bench/results/overhead.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import start_head, table, write  # noqa: E402

GROUP_SIZE, LR, SEED = 8, 1e-4, 0
TASKS = {"tiny-arith": "agents.arithmetic", "smollm2-135m": "digits_task"}   # a task with signal for each


def swarm_step_time(model: str, groups: int, steps: int, warmup: int, device: str) -> float:
    source = TASKS.get(model, "digits_task")
    job = {"models": [{"name": "policy", "source": model, "lr": LR, "eval_every": 10 ** 6, "device": device,
                       "checkpoint_every": 10 ** 6, "eval_max_tokens": 4}],
           "tasks": [{"name": "bench", "source": source, "behavior": f"{source}:behavior"}],
           "train": {"group_size": GROUP_SIZE, "groups_per_step": groups, "steps": steps + warmup,
                     "seed": SEED, "runner_concurrency": 64}}
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp), job, slots=2)
        try:
            metrics = Path(tmp) / "metrics.jsonl"
            last_progress, seen = time.time(), -1
            while True:
                rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
                train = [r for r in rows if r["kind"] == "train"]
                if len(train) >= steps + warmup:
                    break
                if len(train) != seen:
                    last_progress, seen = time.time(), len(train)
                if time.time() - last_progress > 120:
                    raise RuntimeError(f"no learner step for 120 s; see {tmp}/logs")
                time.sleep(0.5)
        finally:
            head.stop()
    t = [r["time"] for r in train]
    return (t[warmup + steps - 1] - t[warmup - 1]) / steps


def baseline_step_time(model: str, groups: int, steps: int, warmup: int, device: str) -> float:
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actorjet.context.samples import call_sample, group_advantages
    from actorjet.job import normalize, prepare
    from actorjet.models.engine import GenRequest, TransformersEngine
    from actorjet.models.grpo import GRPOConfig, grpo_step
    task_module = importlib.import_module(TASKS.get(model, "digits_task"))
    max_tokens = getattr(task_module, "MAX_TOKENS", 4)
    path = prepare(normalize({"models": [{"name": "policy", "source": model}]}))["models"][0]["path"]
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path).to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    engine = TransformersEngine(model=policy, tokenizer=tok, start_thread=False, seed=SEED, device=device)
    tasks = task_module.tasks(SEED)
    times = []
    for _ in range(steps + warmup):
        t0 = time.perf_counter()
        group_tasks = [next(tasks) for _ in range(groups)]
        prompts = [tok(tok.apply_chat_template(task_module.messages(t), add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)["input_ids"] for t in group_tasks]
        policy.eval()
        outs = engine.generate([GenRequest(p, max_tokens, 1.0, n=GROUP_SIZE) for p in prompts])
        samples = []
        for task, prompt, results in zip(group_tasks, prompts, outs):
            rewards = {k: task_module.score(task, tok.decode(r.completion_ids, skip_special_tokens=True))
                       for k, r in enumerate(results)}
            if len(set(rewards.values())) < 2:
                continue
            adv = group_advantages(rewards)
            samples += [call_sample({"prompt_ids": prompt, "completion_ids": r.completion_ids,
                                     "logprobs": r.logprobs, "temperature": 1.0, "weight_version": 0}, adv[k])
                        for k, r in enumerate(results)]
        if samples:
            grpo_step(policy, opt, samples, GRPOConfig(), tok.pad_token_id)
        times.append(time.perf_counter() - t0)
    return sum(times[warmup:]) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--groups", type=int, default=32, help="GRPO groups of 8 per step (default 32)")
    ap.add_argument("--device", default="cpu", help="where engine and learner run: cpu or cuda")
    args = ap.parse_args()
    swarm = swarm_step_time(args.model, args.groups, args.steps, args.warmup, args.device)
    base = baseline_step_time(args.model, args.groups, args.steps, args.warmup, args.device)
    ratio = swarm / base
    table([("one process, direct generate", f"{base:.3f}"), ("swarm (gateway+runners+merger+learner)", f"{swarm:.3f}"),
           ("ratio", f"{ratio:.2f}x (target <= 1.5x)")], ("setup", "s/step"))
    name = "overhead" + ("" if args.model == "tiny-arith" else f"-{args.model}") + \
        ("" if args.device == "cpu" else f"-{args.device}")
    write(name, {"model": args.model, "device": args.device, "cpus": __import__("os").cpu_count(), "groups": args.groups, "group_size": GROUP_SIZE, "steps": args.steps,
           "baseline_s_per_step": base, "swarm_s_per_step": swarm, "ratio": ratio, "target": "<= 1.5x"})


if __name__ == "__main__":
    main()
