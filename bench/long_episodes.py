"""What a long agent episode costs, call by call: storage, gateway CPU, engine time, learner.

    python bench/long_episodes.py [--label after] [--sizes 5x4096,20x16384,50x32768]
    python bench/long_episodes.py --model smollm2-135m --sizes 15x7900 --label smollm2-after

Agents of 5 / 20 / 50 turns whose context grows to 4k / 16k / 32k tokens (``tiny-long``, a
character model with 32k positions; answers of at most 8 tokens) talk to the real gateway over
HTTP; the gateway records into the real episode store; then the learner's pull (next_batch,
with the learner's own drift repair) builds the training batch from the store.  Per size:

  bytes/unique-token-8B   the store's file growth per episode ÷ (the episode's unique tokens × 8
                          bytes: one int32 id + one float32 logprob each)
  engine s turn 1 / last  wall time of the engine's answer at the first and the last turn; beside
                          the ratio, the same ratio of an exact forward pass's arithmetic
                          (``call_macs``): new tokens still attend over the whole context
  gateway ms turn 1/last  CPU of the gateway's event-loop thread for the call plus its store
                          writer's CPU for that call (thread CPU time: the agent runs in another
                          thread, the engine in its own)
  learner us/token        CPU of next_batch (take + credit + repair + pack) per trained token

And one figure for short calls: gateway CPU per call for the quickstart's calls (6-token
prompts, 4-token answers, 8 agents at once), loop thread + writer over 512 calls.

Writes bench/results/long_episodes-LABEL.json.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import parse, table, write  # noqa: E402

from actorjet import signing  # noqa: E402
from actorjet.rl import drift, pack  # noqa: E402
from actorjet.rl.batching import BatchConfig, next_batch  # noqa: E402
from actorjet.models import zoo  # noqa: E402
from actorjet.serving.transformers_engine import TransformersEngine  # noqa: E402
from actorjet.store.episode_store import EpisodeStore  # noqa: E402
from actorjet.serving.gateway_app import GatewayApp, local_backend  # noqa: E402
from actorjet.serving.serve import AppServer  # noqa: E402

SECRET = "bench"
MODEL = "tiny-long"      # --model
WORDS = "the of and to in is for on that with as at by from this be are it an or was not".split()


class Meter:
    """Gateway CPU and engine wall time, per call (one agent at a time)."""

    def __init__(self, gw: GatewayApp):
        self.loop_cpu, self.engine_s, self.writer_cpu = [], [], 0.0
        chat, backend, flush = gw.chat, gw.backend, gw.store.flush

        async def timed_chat(request):
            t0, w0 = time.thread_time(), self.writer_cpu
            try:
                return await chat(request)
            finally:
                self.loop_cpu.append((time.thread_time() - t0) + (self.writer_cpu - w0))

        async def timed_backend(req):
            t0 = time.perf_counter()
            try:
                return await backend(req)
            finally:
                self.engine_s.append(time.perf_counter() - t0)

        def timed_flush():
            t0 = time.thread_time()
            try:
                return flush()
            finally:
                self.writer_cpu += time.thread_time() - t0

        gw.chat, gw.backend, gw.store.flush = timed_chat, timed_backend, timed_flush


def post(url: str, path: str, body: dict, key: str, conn: http.client.HTTPConnection | None = None) -> dict:
    """One call; on ``conn`` (kept alive, as the runners' pooled clients do) or a new connection."""
    own = conn is None
    if own:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    if own:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {data}")
    return data


def long_episode(url: str, episode_id: str, turns: int, context: int, rng: random.Random,
                 chars_per_token: float = 1.0) -> None:
    """A system message, then ``turns`` user messages that grow the context to ~``context``."""
    key = signing.mint_key(SECRET, episode_id)
    per_turn = int(((context - 200) // turns - 24) * chars_per_token)
    messages = [{"role": "system", "content": "You are an agent with a long memory. Answer briefly."}]
    for _ in range(turns):
        text = ""
        while len(text) < per_turn:
            text += rng.choice(WORDS) + " "
        messages.append({"role": "user", "content": text[:per_turn]})
        reply = post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                                                   "max_tokens": 8, "temperature": 1.0}, key)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


def chars_per_token(tokenizer) -> float:
    """How many characters of the agents' words make a token (1 for tiny-long's characters)."""
    text = " ".join(WORDS * 20)
    ratio = len(text) / len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return 1.0 if ratio <= 1.0 else 0.9 * ratio      # a margin: words tokenize unevenly


def store_bytes(store: EpisodeStore) -> int:
    with store.lock:
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (pages,) = store.db.execute("PRAGMA page_count").fetchone()
        (free,) = store.db.execute("PRAGMA freelist_count").fetchone()
        (size,) = store.db.execute("PRAGMA page_size").fetchone()
    return (pages - free) * size


def call_macs(config, context_before: int, new: int, answer: int) -> float:
    """Multiply-accumulates of an exact forward pass that prefills ``new`` tokens after
    ``context_before`` cached ones and decodes ``answer`` more: the per-token projections and
    MLP (O(new)), plus each token's attention over every position before it (O(new x context)),
    plus the output layer for the sampled tokens only.  No cache can remove any of it: the
    more an engine's time is arithmetic (a real GPU, a real model), the closer its last/first
    wall-time ratio comes to the ratio of these."""
    d, layers = config.hidden_size, config.num_hidden_layers
    kv = d // config.num_attention_heads * getattr(config, "num_key_value_heads", config.num_attention_heads)
    linear = layers * (d * (2 * d + 2 * kv) + 3 * d * config.intermediate_size)
    tokens = new + answer
    positions = tokens * context_before + tokens * (tokens + 1) / 2       # sum of each token's context
    return tokens * linear + layers * 2 * d * positions + answer * d * config.vocab_size


def macs_ratio(config, calls: list[dict]) -> float:
    """The last call's exact-forward work ÷ the first call's, for one recorded episode."""
    def macs(i: int) -> float:
        c = calls[i]
        before = 0
        if i:
            prev = calls[i - 1]["prompt_ids"] + calls[i - 1]["completion_ids"][:-1]
            while before < min(len(prev), len(c["prompt_ids"])) and prev[before] == c["prompt_ids"][before]:
                before += 1
        return call_macs(config, before, len(c["prompt_ids"]) - before, len(c["completion_ids"]))
    return macs(len(calls) - 1) / macs(0)


def measure_size(engine, turns: int, context: int, episodes: int, seed: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="long-"))
    store = EpisodeStore(tmp / "s.sqlite")
    gw = GatewayApp(MODEL, engine.tokenizer, local_backend(engine), SECRET, engine.max_len,
                    store=store, default_max_tokens=8)
    meter = Meter(gw)
    server = AppServer(gw.app())
    rng = random.Random(seed)
    try:
        long_episode(server.url, "warm", 2, 512, rng)      # first calls compile the template's paths
        meter.loop_cpu.clear(), meter.engine_s.clear()
        empty = store_bytes(store)
        ids = [f"l{turns}_{e}" for e in range(episodes)]
        for e in ids:
            long_episode(server.url, e, turns, context, rng, chars_per_token(engine.tokenizer))
        store.flush()
        grown = store_bytes(store) - empty
        recorded = store.calls(ids)
        unique = sum(pack.lower_bound([(c, 0.0) for c in calls]) for calls in recorded.values())
        final_prompt = max(len(c["prompt_ids"]) for calls in recorded.values() for c in calls)
        floor = sum(macs_ratio(engine.model.config, calls) for calls in recorded.values()) / episodes
        store.put_results({"group_id": f"g{turns}", "size": episodes, "task_name": "long", "behavior": "long",
                           "version": 1},
                          [{"episode_id": e, "member": k, "reward": float(k % 2)} for k, e in enumerate(ids)])
    finally:
        server.stop()
    learner_s, batch = learner_cost(tmp / "s.sqlite", engine.tokenizer)
    trained = batch["stats"]["tokens_after"]
    calls_per_episode = turns
    first = [meter.loop_cpu[e * calls_per_episode] for e in range(episodes)]
    last = [meter.loop_cpu[e * calls_per_episode + turns - 1] for e in range(episodes)]
    eng_first = [meter.engine_s[e * calls_per_episode] for e in range(episodes)]
    eng_last = [meter.engine_s[e * calls_per_episode + turns - 1] for e in range(episodes)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"turns": turns, "context": context, "episodes": episodes, "final_prompt_tokens": final_prompt,
            "unique_tokens_per_episode": unique / episodes,
            "bytes_per_episode": grown / episodes,
            "bytes_ratio": grown / (unique * 8),
            "engine_s_first": mean(eng_first), "engine_s_last": mean(eng_last),
            "engine_ratio": mean(eng_last) / mean(eng_first), "engine_macs_ratio": floor,
            "gateway_ms_first": mean(first) * 1e3, "gateway_ms_last": mean(last) * 1e3,
            "gateway_ratio": mean(last) / max(1e-9, mean(first)),
            "gateway_ms_per_turn": [round(x * 1e3, 3) for x in meter.loop_cpu[:turns]],
            "engine_s_per_turn": [round(x, 4) for x in meter.engine_s[:turns]],
            "learner_s": learner_s, "trained_tokens": trained,
            "learner_us_per_token": learner_s / max(1, trained) * 1e6,
            "drift_repairs": batch["stats"].get("drift_repairs", 0)}


def learner_cost(path: Path, tok, repeats: int = 5) -> tuple[float, dict]:
    """CPU seconds of one ``next_batch`` on this store (take + credit + repair + pack), the
    median of ``repeats`` runs on fresh copies of the store (one run is ~10 ms: noisy)."""
    def prepare(calls):
        return {"drift_repairs": drift.repair_drift(calls, lambda x: tok.decode(x, skip_special_tokens=True))}

    times = []
    for k in range(repeats):
        copy = path.with_name(f"learner{k}.sqlite")
        with sqlite3.connect(path) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        learner = EpisodeStore(copy)
        t0 = time.thread_time()
        batch = next_batch(learner, BatchConfig(MODEL, 1, merge="tree", max_tokens=1 << 20, prepare=prepare))
        times.append(time.thread_time() - t0)
    return statistics.median(times), batch


def short_calls(calls: int = 512, agents: int = 8, keep_alive: bool = True) -> dict:
    """The quickstart's calls: gateway CPU per call (event-loop thread + store writer).

    The quickstart's agents call through pooled ``openai`` clients (runner/llm.py), whose
    connections stay open between calls; ``keep_alive=False`` opens one per call, which adds
    the kernel's accept/close work (~0.2 ms) to the gateway's thread."""
    engine = TransformersEngine(zoo.tiny_arith(0))
    tmp = Path(tempfile.mkdtemp(prefix="short-"))
    gw = GatewayApp("tiny", engine.tokenizer, local_backend(engine), SECRET, engine.max_len,
                    store=EpisodeStore(tmp / "s.sqlite"))
    meter = Meter(gw)
    server = AppServer(gw.app())
    rng = random.Random(0)
    problems = [f"{rng.randint(0, 99):02d}+{rng.randint(0, 99):02d}=" for _ in range(calls // 8)]

    def agent(k: int) -> None:
        # one kept-alive connection per agent thread, like the runners' pooled openai clients
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=600) if keep_alive else None
        for i in range(k, calls, agents):
            key = signing.mint_key(SECRET, f"s{i}")
            post(server.url, "/v1/chat/completions",
                 {"model": "tiny", "messages": [{"role": "user", "content": problems[i // 8]}],
                  "max_tokens": 4, "temperature": 1.0}, key, conn)
        if conn is not None:
            conn.close()

    def loop_cpu() -> float:
        async def read():
            return time.thread_time()
        return server.call(read())

    agent(0)                                              # warm-up: first calls compile paths
    c0, w0 = loop_cpu(), meter.writer_cpu
    threads = [threading.Thread(target=agent, args=(k,)) for k in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = loop_cpu() - c0 + meter.writer_cpu - w0
    server.stop()
    engine.close()
    return {"calls": calls, "agents": agents, "keep_alive": keep_alive,
            "gateway_ms_per_call": total / calls * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after", help="names the results file (before | after)")
    ap.add_argument("--sizes", default="5x4096,20x16384,50x32768", help="TURNSxCONTEXT, comma-separated")
    ap.add_argument("--episodes", type=int, default=2, help="episodes per size (one GRPO group)")
    ap.add_argument("--model", default="tiny-long", help="a zoo model: tiny-long (32k positions) or smollm2-135m (8k)")
    args = parse(ap, {"sizes": "2x512"})
    global MODEL
    MODEL = args.model
    try:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
        if not sizes or any(len(s) != 2 or s[0] < 1 or not 256 <= s[1] <= zoo.LONG_POSITIONS for s in sizes):
            raise ValueError
    except ValueError:
        ap.error(f"--sizes: TURNSxCONTEXT pairs, turns >= 1, context 256..{zoo.LONG_POSITIONS}, e.g. 5x4096")
    if args.model not in ("tiny-long", "smollm2-135m"):
        ap.error("--model: tiny-long or smollm2-135m")
    if args.episodes < 2:
        ap.error("--episodes must be at least 2 (a GRPO group needs two rewards)")
    engine = TransformersEngine(zoo.resolve(MODEL), max_batch=1)
    if any(c > engine.max_len for _, c in sizes):
        ap.error(f"--sizes: {MODEL} has {engine.max_len} positions")
    rows, results = [], []
    for turns, context in sizes:
        t0 = time.time()
        r = measure_size(engine, turns, context, args.episodes, seed=turns)
        results.append(r)
        rows.append((f"{turns} turns", r["final_prompt_tokens"], f"{r['bytes_ratio']:.2f}",
                     f"{r['engine_s_first']:.3f} / {r['engine_s_last']:.3f}", f"{r['engine_ratio']:.2f} ({r['engine_macs_ratio']:.1f})",
                     f"{r['gateway_ms_first']:.2f} / {r['gateway_ms_last']:.2f}", f"{r['gateway_ratio']:.2f}",
                     f"{r['learner_us_per_token']:.2f}", r["drift_repairs"], f"{time.time() - t0:.0f}"))
        print(rows[-1], flush=True)
    engine.close()
    short = short_calls()
    table(rows, ("episode", "last prompt", "bytes/8B", "engine s first/last", "ratio",
                 "gateway ms first/last", "ratio", "learner us/token", "drift repairs", "wall s"))
    print("engine ratio (n): n is the same ratio for the arithmetic of an exact forward pass (call_macs):"
          " what an engine whose time is all arithmetic would show")
    print(f"short calls (quickstart): gateway CPU {short['gateway_ms_per_call']:.3f} ms per call")
    write(f"long_episodes-{args.label}", {"model": MODEL, "sizes": results, "short_calls": short,
                                          "command": " ".join(["python bench/long_episodes.py"] + sys.argv[1:])})


if __name__ == "__main__":
    main()
