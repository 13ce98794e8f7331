"""The learner on one packed long sample: does a 32k-token step fit, how fast, at what peak?

    python bench/long_sample.py --model shape:llama3-8b --lora --device cuda      # 8B shape + LoRA
    python bench/long_sample.py --model shape:qwen2.5-0.5b --device cuda          # 0.5B shape, full
    python bench/long_sample.py --smoke                                           # tiny-long, CPU, seconds

One conversation merged into one sequence of ``--tokens`` tokens, a quarter of them sampled
(terms), through the learner's own step (rl/grpo.py ``grpo_step``: the loss's log-softmax in
chunks) with activation checkpointing on, ``--repeats`` times.  Models of real shapes are
random-init in bf16 (models/shapes.py); the learner's master weights are float32 as in a job
unless ``--dtype`` says otherwise.

  tokens/s       sequence tokens trained per second (median step)
  peak GiB       the most memory the step held: torch.cuda.max_memory_allocated on a GPU,
                 the process's peak resident set on the CPU

Writes bench/results/LABEL.json (default long_sample-MODEL[-lora]-DEVICE).
"""
from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import parse, table, write  # noqa: E402

import torch  # noqa: E402

from actorjet.config import normalize  # noqa: E402
from actorjet.models import shapes, trainable, zoo  # noqa: E402
from actorjet.rl import grpo, lora  # noqa: E402
from actorjet.rl.algorithms import from_config  # noqa: E402
from actorjet.rl.pack import Packed, Term  # noqa: E402



def long_sample(tokens: int, answers: int, seed: int = 0) -> dict:
    """One conversation merged into one sequence: ``answers`` sampled tokens spread through it."""
    rng = random.Random(seed)
    ids = [rng.randint(10, 90) for _ in range(tokens)]
    nodes = sorted(rng.sample(range(1, tokens), answers))
    terms = [Term(n, rng.uniform(-1, 1), -4.0 + rng.random(), 1.0, 0, call=n // 512) for n in nodes]
    return Packed(ids, list(range(tokens)), list(range(-1, tokens - 1)), terms).to_dict()


def build(args):
    cfg = normalize({"models": [{"source": "tiny-long", "activation_checkpointing": True, "device": args.device,
                                 **({"lora": {"r": 16, "alpha": 32, "target_modules": "all-linear"}} if args.lora else {})}]})
    cfg = cfg["models"][0]
    if shapes.is_shape(args.model):
        model, _ = shapes.build(args.model, args.device, args.dtype, positions=max(32768, args.tokens))
        if args.lora:
            model = lora.attach(model, cfg["lora"]).get_base_model()
        trainable.checkpointing(model)
    else:
        model, _ = trainable.build({**cfg, "path": zoo.resolve(args.model)})
    return model, cfg


def peak_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20      # KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-long", help="a zoo name or shape:NAME (" + ", ".join(shapes.SHAPES) + ")")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", help="weights of a shape: model")
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter (r=16, all linear layers)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="", help="the result file's name (default: long_sample-…)")
    args = parse(ap, {"model": "tiny-long", "tokens": 2048, "repeats": 2})
    model, cfg = build(args)
    algo = from_config(cfg)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    sample = long_sample(args.tokens, args.tokens // 4)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        info = grpo.grpo_step(model, optimizer, [sample], algo, pad_id=0)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    out = {"model": args.model, "lora": args.lora, "device": args.device, "tokens": args.tokens,
           "terms": info["tokens"], "step_s": step_s, "tokens_per_s": args.tokens / step_s,
           "peak_gib": peak_gib(args.device), "steps_s": times,
           "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    table([(args.model + (" + LoRA" if args.lora else ""), args.device, args.tokens, f"{step_s:.2f}",
            f"{out['tokens_per_s']:.0f}", f"{out['peak_gib']:.1f}")],
          ("model", "device", "tokens", "step s", "tokens/s", "peak GiB"))
    label = args.model.replace("shape:", "") + ("-lora" if args.lora else "") + "-" + args.device
    write(args.label or f"long_sample-{label}", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
