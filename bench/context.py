"""Context tracker benchmark: none / prefix / tree on multi-turn and multi-agent workloads.

    python bench/context.py [--models tiny-arith,smollm2-135m] [--repeats 3]

For each workload: training tokens, learner step wall time (forward + backward, one
GRPO step) per model, speedup vs none, and the lower bound (the trie's token count).
Workloads are synthetic token streams shaped like real episodes (sizes scaled per model
to its context length), plus one recorded from real episodes through the gateway.
Writes bench/results/context.json.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from actorjet.context.pack import pack, pack_tree, repair_drift  # noqa: E402
from common import table, write  # noqa: E402

SCALE = {"tiny-arith": 1, "smollm2-135m": 4}          # token sizes × this (tiny: 256 positions)


def _call(prompt, completion, role="agent", index=0, rng=None):
    rng = rng or random.Random(0)
    return {"model": "m", "role": role, "episode_id": "e", "call_index": index, "choice": 0,
            "prompt_ids": list(prompt), "completion_ids": list(completion), "temperature": 1.0,
            "weight_version": 0, "logprobs": [-rng.random() for _ in completion]}


def multi_turn(turns: int, s: int, vocab: int, rng) -> list:
    tok = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    history, calls = tok(12 * s), []
    for t in range(turns):
        answer = tok(3 * s)
        calls.append(_call(history, answer, index=t, rng=rng))
        history = history + answer + tok(3 * s)          # the tool / user reply
    return calls


def shared_history(agents: int, turns: int, s: int, vocab: int, rng) -> list:
    tok = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    history, calls, i = tok(12 * s), [], 0
    for _ in range(turns):
        for a in range(agents):                          # each agent reads the shared history
            answer = tok(3 * s)
            calls.append(_call(history + tok(2 * s), answer, role=f"agent{a}", index=i, rng=rng))
            i += 1
        history = history + tok(4 * s)
    return calls


def retry_heavy(turns: int, s: int, vocab: int, rng) -> list:
    tok = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    history, calls, i = tok(12 * s), [], 0
    for _ in range(turns):
        for _attempt in range(rng.randint(1, 3)):        # tool error → retry from the same context
            calls.append(_call(history, tok(3 * s), index=i, rng=rng))
            i += 1
        history = history + calls[-1]["completion_ids"] + tok(2 * s)
    return calls


def grpo_group(samples: int, s: int, vocab: int, rng) -> list:
    tok = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    prompt = tok(40 * s)
    return [_call(prompt, tok(4 * s), index=k, rng=rng) for k in range(samples)]


def real_episodes(model_dir: Path, n_episodes: int = 16) -> tuple[list, object]:
    """Calls recorded by the real gateway from a 3-turn agent using the openai SDK."""
    from actorjet.models import keys
    from actorjet.models.engine import TransformersEngine
    from actorjet.models.gateway import Gateway, local_backend
    from actorjet.models.serve import AppServer
    from actorjet.runner.llm import LLM
    from agents import multiturn

    engine = TransformersEngine(model_dir)
    gw = Gateway("m", engine.tokenizer, local_backend(engine), "bench", engine.max_len)
    server = AppServer(gw.app())
    try:
        for e in range(n_episodes):
            task = next(multiturn.tasks(e))
            multiturn.behavior(task, LLM({"m": server.url + "/v1"}, keys.mint("bench", f"r{e}")))
        recorded = gw.store.collect([f"r{e}" for e in range(n_episodes)])
    finally:
        server.stop()
        engine.close()
    decode = lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    return [c for calls in recorded.values() for c in calls], decode


def step_time(model, samples: list[dict], repeats: int) -> float:
    from actorjet.models.grpo import GRPOConfig, grpo_step

    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    grpo_step(model, opt, samples, GRPOConfig(), 0)        # warm-up
    t0, n = time.perf_counter(), 0
    while n < repeats or time.perf_counter() - t0 < 0.5:  # small steps: repeat for a stable mean
        grpo_step(model, opt, samples, GRPOConfig(), 0)
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from actorjet.job import normalize, prepare

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny-arith,smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="context", help="results file name under bench/results/")
    args = ap.parse_args()
    torch.set_num_threads(2)
    results, rows = {}, []
    for source in args.models.split(","):
        path = Path(prepare(normalize({"models": [{"name": "m", "source": source}]}))["models"][0]["path"])
        vocab = AutoConfig.from_pretrained(path).vocab_size
        model = AutoModelForCausalLM.from_pretrained(path)
        s, rng = SCALE.get(source, 4), random.Random(0)
        workloads = {"multi-turn 3": multi_turn(3, s, vocab, rng), "multi-turn 10": multi_turn(10, s, vocab, rng),
                     "multi-turn 20": multi_turn(20, s, vocab, rng),
                     "3 agents, shared history": shared_history(3, 4, s, vocab, rng),
                     "retry-heavy": retry_heavy(8, s, vocab, rng), "GRPO group of 8": grpo_group(8, s, vocab, rng)}
        repairs = 0
        if source == "tiny-arith":
            real, decode = real_episodes(path)
            workloads["real: 3-turn agent via gateway"] = real
        for name, calls in workloads.items():
            with_adv = [(c, random.Random(i).uniform(-1, 1)) for i, c in enumerate(calls)]
            if name.startswith("real"):
                repairs = repair_drift(with_adv, decode)
            bound = sum(len(p.input_ids) for p in pack_tree(with_adv))
            entry = {"calls": len(calls), "lower_bound_tokens": bound,
                     "drift_repairs": repairs if name.startswith("real") else 0}
            for mode in ("none", "prefix", "tree"):
                packed = [p.to_dict() for p in pack(with_adv, mode)]
                tokens = sum(len(p["input_ids"]) for p in packed)
                entry[mode] = {"tokens": tokens, "sequences": len(packed), "step_s": step_time(model, packed, args.repeats)}
            for mode in ("prefix", "tree"):
                entry[mode]["speedup"] = entry["none"]["step_s"] / entry[mode]["step_s"]
                entry[mode]["token_ratio"] = entry["none"]["tokens"] / entry[mode]["tokens"]
            results.setdefault(source, {})[name] = entry
            rows.append((source, name, entry["calls"], entry["none"]["tokens"], entry["prefix"]["tokens"],
                         entry["tree"]["tokens"], bound, f"{entry['none']['step_s'] * 1000:.0f}",
                         f"{entry['prefix']['speedup']:.2f}x", f"{entry['tree']['speedup']:.2f}x"))
            print("  ".join(str(c) for c in rows[-1]), flush=True)
    table(rows, ("model", "workload", "calls", "tokens none", "prefix", "tree", "lower bound",
                 "step ms none", "speedup prefix", "speedup tree"))
    write(args.out, {"results": results, "targets": {"speedup_3_turns": ">= 1.5x", "speedup_20_turns": ">= 5x",
                                                      "tree_vs_prefix": "tree >= prefix everywhere",
                                                      "tree_vs_lower_bound": "within 5%"}})


if __name__ == "__main__":
    main()
