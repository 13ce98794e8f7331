"""Scale out on one machine: learner step time for 1 vs 2 ranks on the same global batch, and
engine throughput for 1 vs 2 replicas behind the gateway's router (issue 33).

    python bench/scale.py [--model tiny-long] [--repeats 3] [--episodes 32]

Ranks: the same tree-packed batch, one process with every thread vs two FSDP2 ranks (gloo)
with the threads split between them (rl/ranks.py).  Replicas: engine processes with the
cores split between them, called through serving/engine_client.py's ReplicaRouter by
``--episodes`` concurrent 3-turn episodes.  On a 2-core machine the cores, not the
processes, are the limit: the ratios say what splitting them costs or saves, not what a
second GPU gives.  Prints a table and writes bench/results/scale-MODEL.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import parse, table, write  # noqa: E402

CORES = os.cpu_count() or 2
# What the ranks and engine replicas import, once: each is forked from one server process that
# has imported it (multiprocessing's forkserver, as the runner's task workers are), where spawn
# imported torch and transformers again in every process (~3.5 CPU-s each, five processes).
# The server only imports: no torch op runs before a fork (a forked OpenMP pool deadlocks).
PRELOAD = ["torch", "transformers", "actorjet.rl.ranks", "actorjet.rl.grpo", "actorjet.serving.weights",
           "actorjet.serving.engine_wire", "actorjet.serving.transformers_engine", "actorjet.runtime.head"]


def _processes() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def batch(seed: int = 0, episodes: int = 16, vocab: int = 90) -> list[dict]:
    """Multi-turn episodes with forks over one system prompt, tree-packed (the learner's input)."""
    from actorjet.rl.pack import pack

    rng = random.Random(seed)
    tok = lambda n: [rng.randint(4, vocab) for _ in range(n)]  # noqa: E731
    calls, system = [], tok(64)
    for e in range(episodes):
        history = system + tok(32)
        for turn in range(4):
            completion = tok(24)
            calls.append(({"model": "m", "role": "a", "episode_id": f"e{e}", "call_index": turn, "choice": 0,
                           "prompt_ids": list(history), "completion_ids": completion, "temperature": 1.0,
                           "weight_version": 0, "logprobs": [-rng.random() for _ in completion]},
                          rng.uniform(-1, 1)))
            history = history + completion + tok(16)
    return [p.to_dict() for p in pack(calls, "tree", max_tokens=512)]


def _step_times(model_dir: str, samples: list[dict], repeats: int, rank: int = 0, world: int = 1,
                port: int = 0, out: str = "", device: str = "cpu", sharded: bool | None = None) -> dict:
    """Timed learner steps (and publishes) of one rank; ``sharded``: join a group even alone
    (a GPU's one rank over nccl; default: when ``world`` > 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    from actorjet.rl import ranks
    from actorjet.rl.algorithms import Algorithm
    from actorjet.rl.grpo import grpo_step
    from actorjet.serving import weights

    torch.set_num_threads(max(1, CORES // world))
    sharded = world > 1 if sharded is None else sharded
    group = ranks.join(rank, world, "127.0.0.1", port, device=device) if sharded else None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if group is not None:
        model = ranks.shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times, publish, losses = [], [], []
    for _ in range(repeats + 1):                     # the first is a warm-up
        t0 = time.perf_counter()
        info = grpo_step(model, opt, samples, Algorithm(), 0, ranks=group)
        times.append(time.perf_counter() - t0)
        losses.append((info["loss"], info["grad_norm"]))
    target = Path(os.environ.get("TMPDIR", "/tmp")) / f"scale-publish-{os.getpid()}.safetensors"
    whole = (AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
             if group is not None and rank == 0 else None)       # rank 0's unsharded copy, as in the learner
    held = {}
    for way in ("state dict", "streamed") if group is not None else ("state dict",):
        for _ in range(repeats):  # a weight version: gathered from the shards on rank 0, then written
            with _PeakRss() as peak:
                t0 = time.perf_counter()
                if group is None:
                    tensors = model.state_dict()
                elif way == "state dict":        # the gather before streaming: a whole dict on rank 0
                    tensors = _state_dict_gather(model)
                    if whole is not None:
                        whole.load_state_dict(tensors, strict=False)
                    tensors = whole.state_dict() if whole is not None else {}
                else:
                    ranks.gather_into(model, whole)
                    tensors = whole.state_dict() if whole is not None else {}
                if rank == 0:
                    weights.publish(tensors, target, {"version": "0"})
                del tensors
                publish.append((way, time.perf_counter() - t0))
            held[way] = max(held.get(way, 0), peak.bytes)
    target.unlink(missing_ok=True)
    result = {"step": times[1:], "publish": publish, "rank0_peak_extra_bytes": held, "loss_and_grad_norm": losses}
    if out and rank == 0:
        Path(out).write_text(json.dumps(result))
    if group is not None:
        ranks.leave()
    return result


def _state_dict_gather(model) -> dict:
    """How rank 0 gathered a version before rl/ranks.py's gather_into: every tensor at once."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class _PeakRss:
    """This process's resident memory above where it was on entry, at its highest (sampled
    every millisecond by a thread): what one publish held beyond the model and its shards."""

    def __enter__(self):
        import threading

        import psutil

        self.proc, self.bytes, self.done = psutil.Process(), 0, threading.Event()
        self.start = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.001):
            self.bytes = max(self.bytes, self.proc.memory_info().rss - self.start)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def learner_ranks(model_dir: str, repeats: int, device: str = "cpu") -> dict:
    from actorjet.runtime.system import free_port

    samples = batch()
    if device != "cpu":       # one GPU: one FSDP2 rank over nccl against one plain process, the same steps
        plain = _step_times(model_dir, samples, repeats, device=device, sharded=False)
        nccl = _step_times(model_dir, samples, repeats, 0, 1, free_port(), device=device, sharded=True)
        pairs = list(zip(nccl["loss_and_grad_norm"], plain["loss_and_grad_norm"]))
        loss_gap = max(abs(a[0] - b[0]) for a, b in pairs)
        norm_gap = max(abs(a[1] - b[1]) / max(b[1], 1e-12) for a, b in pairs)
        return {"sequences": len(samples), "one_process_s": statistics.median(plain["step"]),
                "one_rank_nccl_s": statistics.median(nccl["step"]), "loss_gap": loss_gap, "grad_norm_rel_gap": norm_gap,
                # tests/test_ranks.py's tolerance for 2 gloo ranks against 1 process
                "equal": loss_gap <= 1e-6 and norm_gap <= 1e-5,
                "plain": plain["loss_and_grad_norm"], "nccl": nccl["loss_and_grad_norm"]}
    one = _step_times(model_dir, samples, repeats)
    out = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"scale-ranks-{os.getpid()}.json")
    port = free_port()
    procs = [_processes().Process(target=_step_times, args=(model_dir, samples, repeats, r, 2, port, out))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    two = json.loads(Path(out).read_text())
    Path(out).unlink()
    tokens = sum(len(s["input_ids"]) for s in samples)
    one_s, two_s = statistics.median(one["step"]), statistics.median(two["step"])
    return {"sequences": len(samples), "sequence_tokens": tokens, "one_rank_s": one_s, "two_ranks_s": two_s,
            "ratio": two_s / one_s, "one_rank_publish_s": statistics.median(t for _, t in one["publish"]),
            "two_ranks_publish_s": {way: statistics.median(t for w, t in two["publish"] if w == way)
                                    for way in ("state dict", "streamed")},
            "two_ranks_rank0_peak_extra_mb": {w: b / 2 ** 20 for w, b in two["rank0_peak_extra_bytes"].items()},
            "model_mb": _model_mb(model_dir)}


def _model_mb(model_dir: str) -> float:
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors")) / 2 ** 20


def _serve_engine(model_dir: str, threads: int, port_file: str, device: str = "cpu") -> None:
    import torch

    from actorjet.serving.engine_wire import engine_app
    from actorjet.serving.serve import AppServer
    from actorjet.serving.transformers_engine import TransformersEngine

    torch.set_num_threads(threads)
    engine = TransformersEngine(model_dir, seed=0, device=device)
    server = AppServer(engine_app(engine))
    Path(port_file).write_text(server.url)
    while True:
        time.sleep(3600)


def engine_replicas(model_dir: str, n: int, episodes: int, device: str = "cpu") -> dict:
    """Tokens generated per second by ``episodes`` concurrent 3-turn episodes over ``n`` replicas."""
    from transformers import AutoTokenizer

    from actorjet.serving.batching_engine import GenRequest
    from actorjet.serving.engine_client import ReplicaRouter

    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    files = [tmp / f"scale-engine-{os.getpid()}-{k}" for k in range(n)]
    procs = [_processes().Process(target=_serve_engine, args=(model_dir, max(1, CORES // n), str(f), device),
                                  daemon=True) for f in files]
    for p in procs:
        p.start()
    try:
        deadline = time.time() + 300
        while not all(f.exists() for f in files):
            if time.time() > deadline:
                raise RuntimeError("the engines did not start")
            time.sleep(0.2)
        router = ReplicaRouter()
        router.set_replicas({("engine" + (f".{k}" if k else "")): f.read_text() for k, f in enumerate(files)})
        prompt = AutoTokenizer.from_pretrained(model_dir)("The answer is", add_special_tokens=False)["input_ids"]

        async def episode(e: int) -> int:
            made, history = 0, list(prompt) * 8
            for turn in range(3):
                [r] = await router(GenRequest(history, 32, 1.0, seed=e * 10 + turn, cache_key=f"e{e}/a"))
                made += len(r.completion_ids)
                history = history + list(r.completion_ids) + list(prompt)
            return made

        async def run() -> tuple[int, float]:
            await asyncio.gather(*(episode(-1 - k) for k in range(n)))        # warm-up
            t0 = time.perf_counter()
            made = await asyncio.gather(*(episode(e) for e in range(episodes)))
            seconds = time.perf_counter() - t0
            await router.close()
            return sum(made), seconds
        tokens, seconds = asyncio.run(run())
        return {"replicas": n, "episodes": episodes, "tokens": tokens, "seconds": seconds,
                "tokens_per_s": tokens / seconds, "served": dict(router.served)}
    finally:
        for p in procs:
            p.kill()
        for f in files:
            f.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-long", help="a zoo model (default %(default)s: 32k positions)")
    ap.add_argument("--repeats", type=int, default=3, help="timed learner steps per setting (after one warm-up)")
    ap.add_argument("--episodes", type=int, default=32, help="concurrent episodes for the engine runs")
    ap.add_argument("--device", default="cpu", help="cuda: one GPU, both replicas on it, one rank over nccl")
    ap.add_argument("--label", default="", help="the result file's name (default: scale-MODEL[-DEVICE])")
    args = parse(ap, {"repeats": 1, "episodes": 4})
    from actorjet.models import zoo

    model_dir = str(zoo.resolve(args.model))
    ranks = learner_ranks(model_dir, args.repeats, args.device)
    engines = [engine_replicas(model_dir, n, args.episodes, args.device) for n in (1, 2)]
    if args.device != "cpu":
        print(json.dumps({"learner_ranks": ranks, "engine_replicas": engines}, indent=1))
        write(args.label or f"scale-{args.model}-{args.device}", {"learner_ranks": ranks, "engine_replicas": engines})
        return 0
    rows = [("learner step, 1 rank", f"{ranks['one_rank_s']:.3f} s", f"{CORES} threads"),
            ("learner step, 2 ranks (FSDP2, gloo)", f"{ranks['two_ranks_s']:.3f} s",
             f"{max(1, CORES // 2)} thread(s) each; ratio {ranks['ratio']:.2f}"),
            ("weight version, 1 rank (state dict + write)", f"{ranks['one_rank_publish_s']:.3f} s", ""),
            *[(f"weight version, 2 ranks, {way} (gather on rank 0 + write)",
               f"{ranks['two_ranks_publish_s'][way]:.3f} s",
               f"rank 0 held {ranks['two_ranks_rank0_peak_extra_mb'][way]:.1f} MB more at its peak "
               f"(model {ranks['model_mb']:.1f} MB)") for way in ("state dict", "streamed")],
            *[(f"engine, {e['replicas']} replica(s)", f"{e['tokens_per_s']:.0f} tokens/s",
               f"{e['episodes']} episodes x 3 turns; served {e['served']}") for e in engines]]
    table(rows, ("what", "measured", "notes"))
    print(f"engine throughput ratio 2:1 replicas = {engines[1]['tokens_per_s'] / engines[0]['tokens_per_s']:.2f} "
          f"on {CORES} cores (the cores are split, not added)")
    write(args.label or f"scale-{args.model}", {"model": args.model, "cores": CORES, "learner_ranks": ranks, "engine_replicas": engines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
