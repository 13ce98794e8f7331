"""Exactness of the context tracker: packed vs unmerged per-token logprobs, float32.

    python bench/exactness.py [--episodes 1000]

Random episodes from tests/test_context.py's hypothesis strategy (multi-turn chains,
retries, forks, interleaved roles, two models) on tiny-arith; for each packing, the largest
|logprob(packed) - logprob(call alone)| with the learner's exact attention kernel
(`attention = "exact"`) and with the model's stock float32 eager kernel.
Target (issue 4): <= 1e-5.  Writes bench/results/exactness.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import test_context as T  # noqa: E402
from actorjet.rl import exact_attention  # noqa: E402
from actorjet.models import zoo  # noqa: E402
from actorjet.rl.grpo import collate, term_logprobs  # noqa: E402
from common import parse, table, write  # noqa: E402

MODES = ("prefix", "tree", "tree-split")


def worst_differences(attention: str, episodes: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0), attn_implementation=attention).eval()
    worst = dict.fromkeys(MODES, 0.0)

    @settings(max_examples=episodes, deadline=None, database=None, derandomize=True)
    @given(calls=T.episodes())
    def run(calls):
        for group in T.by_model(calls).values():
            want = sorted(T.reference_terms(model, group).values())
            for mode in MODES:
                with torch.no_grad():
                    got = sorted(float(x) for p in T.packed_for(group, mode)
                                 for x in term_logprobs(model, collate([p], 0)))
                worst[mode] = max(worst[mode], max(abs(a - b) for a, b in zip(got, want)))

    run()
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1000)
    args = parse(ap, {"episodes": 20})
    if args.episodes < 1:
        ap.error("--episodes must be >= 1")
    torch.set_num_threads(1)         # as the learner runs a small model
    results = {"exact": worst_differences(exact_attention.register(), args.episodes),
               "eager": worst_differences("eager", args.episodes)}
    table([(kernel, *(f"{r[m]:.2e}" for m in MODES)) for kernel, r in results.items()],
          ("attention", *(f"max diff {m}" for m in MODES)))
    write("exactness", {"episodes": args.episodes, "max_abs_logprob_diff": results, "target": "<= 1e-5"})


if __name__ == "__main__":
    main()
