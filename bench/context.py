"""Context tracker benchmark: none / prefix / tree on multi-turn and multi-agent workloads.

    python bench/context.py [--models tiny-arith,smollm2-135m] [--repeats 3]

For each workload: training tokens, learner step wall time (forward + backward, one
GRPO step) per model, speedup vs none, and the lower bound (the trie's token count).
Workloads are synthetic token streams shaped like real episodes (sizes scaled per model
to its context length), plus one recorded from real episodes through the gateway.
A learner step trains a batch of episodes, as in a real run (``EPISODES`` per model: 16
on the tiny model like the recorded workload; fewer on SmolLM2 to keep the unmerged
baseline affordable on a CPU), packed with the learner's own limit of 4096 tokens per
tree.  Timing one episode per step would mostly measure the fixed cost of a step.
Writes bench/results/context.json.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from actorjet.rl.drift import repair_drift  # noqa: E402
from actorjet.rl.pack import lower_bound, pack  # noqa: E402
from common import parse, table, write  # noqa: E402

SCALE = {"tiny-arith": 1, "smollm2-135m": 4}          # token sizes × this (tiny: 256 positions)
EPISODES = {"tiny-arith": 16, "smollm2-135m": 1}      # episodes per learner step
TREE_MAX_TOKENS = 4096                                # as BatchConfig.max_tokens (rl/batching.py)


def batch(make, episodes: int, rng) -> list:
    """``episodes`` independent episodes of one workload (fresh tokens each)."""
    calls = []
    for k in range(episodes):
        for call in make(rng):
            call["episode_id"] = f"e{k}"
            calls.append(call)
    return calls


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
    from actorjet import signing
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer
    from actorjet.runner.llm import LLM
    from actorjet_agents import multiturn

    engine = TransformersEngine(model_dir)
    gw = GatewayApp("m", engine.tokenizer, local_backend(engine), "bench", engine.max_len)
    server = AppServer(gw.app())
    try:
        for e in range(n_episodes):
            task = next(multiturn.tasks(e))
            multiturn.behavior(task, LLM({"m": server.url + "/v1"}, signing.mint_key("bench", f"r{e}")))
        recorded = gw.store.calls([f"r{e}" for e in range(n_episodes)])
    finally:
        server.stop()
        engine.close()
    decode = lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    return [c for calls in recorded.values() for c in calls], decode


def step_times(model, packings: dict[str, list[dict]], repeats: int) -> dict[str, float]:
    """Median learner-step time per packing, measured in interleaved rounds so that drifts
    of the machine (other processes, thermal) hit every packing alike."""
    from actorjet.rl.algorithms import Algorithm
    from actorjet.rl.grpo import grpo_step

    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    # Packings that came out identical (e.g. tree = prefix on plain chains) are the same
    # computation: time them once, so noise cannot rank equal work differently.
    unique: dict[str, str] = {}
    key = {mode: sorted(map(repr, samples)) for mode, samples in packings.items()}    # order-free
    for mode in packings:
        unique[mode] = next((c for c in unique.values() if key[c] == key[mode]), mode)
    times: dict[str, list[float]] = {mode: [] for mode in packings if unique[mode] == mode}
    for mode in times:
        grpo_step(model, opt, packings[mode], Algorithm(), 0)        # warm-up
    rounds = max(repeats, 1)
    for _ in range(rounds):
        for mode in times:
            samples = packings[mode]
            t0, n = time.perf_counter(), 0
            while n < 1 or time.perf_counter() - t0 < 0.1:    # small steps: repeat within a round
                grpo_step(model, opt, samples, Algorithm(), 0)
                n += 1
            times[mode].append((time.perf_counter() - t0) / n)
    return {mode: statistics.median(times[unique[mode]]) for mode in packings}


def main() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from actorjet.config import normalize
    from actorjet.models.prepare import prepare

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny-arith,smollm2-135m")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (median)")
    ap.add_argument("--out", default="context", help="results file name under bench/results/")
    ap.add_argument("--attention", default="model", choices=("model", "exact"),
                    help="the model's own attention kernel, or the learner's exact one (attention = \"exact\")")
    args = parse(ap, {"models": "tiny-arith", "repeats": 1})
    load = {}
    if args.attention == "exact":
        from actorjet.rl import exact_attention
        load["attn_implementation"] = exact_attention.register()
    torch.set_num_threads(2)
    results, rows = {}, []
    for source in args.models.split(","):
        path = Path(prepare(normalize({"models": [{"name": "m", "source": source}]}))["models"][0]["path"])
        vocab = AutoConfig.from_pretrained(path).vocab_size
        model = AutoModelForCausalLM.from_pretrained(path, **load)
        s, rng, n = SCALE.get(source, 4), random.Random(0), EPISODES.get(source, 2)
        workloads = {"multi-turn 3": batch(lambda r: multi_turn(3, s, vocab, r), n, rng),
                     "multi-turn 10": batch(lambda r: multi_turn(10, s, vocab, r), n, rng),
                     "multi-turn 20": batch(lambda r: multi_turn(20, s, vocab, r), n, rng),
                     "3 agents, shared history": batch(lambda r: shared_history(3, 4, s, vocab, r), n, rng),
                     "retry-heavy": batch(lambda r: retry_heavy(8, s, vocab, r), n, rng),
                     "GRPO group of 8": batch(lambda r: grpo_group(8, s, vocab, r), max(1, n // 8), rng)}
        repairs = 0
        if source == "tiny-arith":
            real, decode = real_episodes(path)
            workloads["real: 3-turn agent via gateway"] = real
        for name, calls in workloads.items():
            with_adv = [(c, random.Random(i).uniform(-1, 1)) for i, c in enumerate(calls)]
            if name.startswith("real"):
                repairs = repair_drift(with_adv, decode)
            bound = lower_bound(with_adv)
            entry = {"calls": len(calls), "episodes": len({c["episode_id"] for c in calls}), "lower_bound_tokens": bound,
                     "drift_repairs": repairs if name.startswith("real") else 0}
            packings = {mode: [p.to_dict() for p in pack(with_adv, mode, max_tokens=TREE_MAX_TOKENS)]
                        for mode in ("none", "prefix", "tree")}
            for mode, seconds in step_times(model, packings, args.repeats).items():
                packed = packings[mode]
                entry[mode] = {"tokens": sum(len(p["input_ids"]) for p in packed), "sequences": len(packed),
                               "step_s": seconds}
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
    write(args.out, {"attention": args.attention, "results": results, "targets": {"speedup_3_turns": ">= 1.5x", "speedup_20_turns": ">= 5x",
                                                      "tree_vs_prefix": "tree >= prefix everywhere",
                                                      "tree_vs_lower_bound": "within 5%"}})


if __name__ == "__main__":
    main()
