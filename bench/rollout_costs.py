"""The CPU cost of each piece of the rollout path, before and after this round of changes.

    python bench/rollout_costs.py [--rounds 6]

On a shared machine the CPU's speed drifts by 2x from one minute to the next, so end-to-end
runs cannot show a 10% change.  Each row here times two variants of one piece in the same
process, alternating in rounds, and reports CPU time (``time.process_time``) per unit:

  sdk call        the quickstart agent's ``chat.completions.create`` (client side only; a
                  stdlib server in another process answers): the SDK's default httpx
                  transport vs ActorJet's lean transport (runner/llm.py)
  engine sampling a 128-request batch of tiny-arith, 4 tokens: one multinomial per row vs
                  one per batch (serving/transformers_engine.py, _sample)
  engine batch    the same 128 requests generated as 4 batches of 32 vs 1 of 128 (what the
                  busy batching window buys: batches grew from ~38 to ~58 requests)
  engine prefill  the same 128 requests, 16 GRPO groups of 8 members with the same prompt:
                  each request prefilled vs each group's prompt once, its members decoded
                  from it (serving/transformers_engine.py, _alike)
  engine prefix   64 tiny-long prompts that open with the same 400 ids (a task's system
                  prompt and worked example), then 20-40 of their own, 8 new tokens: each
                  prompt prefilled whole vs the prefix once (_share_prefixes)
  engine wakeups  a /generate call of 64 requests answered from the batcher's thread: the
                  event loop woken per request (asyncio.wrap_future) vs once per call
                  (serving/engine_wire.py, all_done)
  gateway prompt  rendering a conversation (chat template + tokenizer) vs reusing the ids of
                  an identical one (a GRPO group's 8 members send the same conversation)
  request read    an aiohttp server's CPU per chat-sized request sent as http.client sends
                  it (headers, then body: two TCP segments, two reads) vs in one write
                  (runtime/http_json.py, under the runners' lean transport too); the server's
                  CPU, not this process's

Writes bench/results/rollout_costs.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import parse, table, write  # noqa: E402

ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
SERVER = f"""
import socket
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
BODY = {ANSWER!r}.encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def setup(self):
        super().setup(); self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY))); self.end_headers(); self.wfile.write(BODY)
    def log_message(self, *a): pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H); print(srv.server_address[1], flush=True); srv.serve_forever()
"""


def alternate(variants: dict, rounds: int, units: int) -> dict:
    """CPU ms per unit of each variant, timed in alternating rounds."""
    spent = {name: 0.0 for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            start = time.process_time()
            run()
            spent[name] += time.process_time() - start
    return {name: 1000 * s / (rounds * units) for name, s in spent.items()}


def swapped(owner, name: str, value, run):
    """A variant to time: ``owner.name`` set to ``value`` (the code before a change), then ``run()``."""
    def variant():
        setattr(owner, name, value)
        run()
    return variant


def sdk_call(rounds: int) -> dict:
    import openai

    from actorjet.runner.llm import LeanTransport
    from actorjet_agents import arithmetic

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        clients = {"httpx (SDK default)": openai.OpenAI(base_url=url, api_key="k"),
                   "lean transport": openai.OpenAI(base_url=url, api_key="k", http_client=openai.DefaultHttpxClient(
                       transport=LeanTransport()))}
        task, n = next(arithmetic.tasks(0)), 200

        def calls(client):
            return lambda: [client.chat.completions.create(model="m", messages=arithmetic.messages(task), max_tokens=4,
                                                           temperature=1.0) for _ in range(n)]
        return alternate({name: calls(c) for name, c in clients.items()}, rounds, n)
    finally:
        server.kill()
        server.wait()


def engine_batches(rounds: int) -> tuple[dict, dict, dict]:
    import torch

    from actorjet.models import zoo
    from actorjet.serving import transformers_engine
    from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
    from actorjet_agents import arithmetic

    torch.set_num_threads(1)              # as the engine actor runs a small model
    engine = TransformersEngine(zoo.resolve("tiny-arith", 0), start_thread=False)
    tasks = arithmetic.tasks(0)
    reqs = []
    for _ in range(16):
        text = engine.tokenizer.apply_chat_template(arithmetic.messages(next(tasks)), add_generation_prompt=True,
                                                    tokenize=False)
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        reqs += [GenRequest(list(ids), 4, 1.0) for _ in range(8)]

    def per_row(self, logp, greedy, top_ps, gens):       # the sampler before this change
        tokens, probs = logp.argmax(-1), logp.exp()
        for b in range(logp.shape[0]):
            if not greedy[b]:
                tokens[b] = torch.multinomial(probs[b], 1, generator=gens[b] or self.generator)[0]
        return tokens

    batched = engine._sample

    def four_batches():
        for _ in range(4):
            engine._generate(reqs)

    sample = alternate({"one multinomial per row": swapped(engine, "_sample", types.MethodType(per_row, engine),
                                                           four_batches),
                        "one per batch": swapped(engine, "_sample", batched, four_batches)}, rounds, 4 * len(reqs) // 128)
    engine._sample = batched
    sizes = alternate({"4 batches of 32": lambda: [engine._generate(reqs[i:i + 32]) for i in range(0, 128, 32)],
                       "1 batch of 128": lambda: engine._generate(reqs)}, rounds, 1)
    shared = transformers_engine._alike
    one_batch = lambda: engine._generate(reqs)       # noqa: E731
    prefills = alternate({"each request": swapped(transformers_engine, "_alike",
                                                  lambda reqs, kept: [[i] for i in range(len(reqs))], one_batch),
                          "once per group": swapped(transformers_engine, "_alike", shared, one_batch)}, rounds, 1)
    transformers_engine._alike = shared
    engine.close()
    return sample, sizes, prefills


def engine_prefix(rounds: int) -> dict:
    import random

    import torch

    from actorjet.models import zoo
    from actorjet.serving.transformers_engine import GenRequest, TransformersEngine

    torch.set_num_threads(1)
    engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=0)
    rng = random.Random(0)
    prefix = [rng.randint(10, 90) for _ in range(400)]
    reqs = [GenRequest(prefix + [rng.randint(10, 90) for _ in range(rng.randint(20, 40))], 8, 1.0) for _ in range(64)]
    shared = engine._share_prefixes
    one_batch = lambda: engine._generate(reqs)       # noqa: E731
    spent = alternate({"each prompt whole": swapped(engine, "_share_prefixes", lambda reqs, kept: kept, one_batch),
                       "the prefix once": swapped(engine, "_share_prefixes", shared, one_batch)}, rounds, 1)
    engine.close()
    return spent


def engine_wakeups(rounds: int) -> dict:
    import asyncio
    from concurrent.futures import Future, ThreadPoolExecutor

    from actorjet.serving.engine_wire import all_done

    pool, calls = ThreadPoolExecutor(1), 200

    async def one_call(wait):
        futures = [Future() for _ in range(64)]
        pool.submit(lambda: [f.set_result([]) for f in futures])      # a batch answering
        await wait(futures)

    async def per_request(futures):
        await asyncio.gather(*[asyncio.wrap_future(f) for f in futures])

    def run(wait):
        async def many():
            for _ in range(calls):
                await one_call(wait)
        return lambda: asyncio.run(many())

    try:
        return alternate({"wrap_future per request": run(per_request), "one wakeup per call": run(all_done)},
                         rounds, calls)
    finally:
        pool.shutdown()


def gateway_prompt(rounds: int) -> dict:
    from actorjet.serving import openai_api as api
    from actorjet.models import zoo
    from actorjet.serving.gateway_app import GatewayApp
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(zoo.resolve("tiny-arith", 0))
    gw = GatewayApp("m", tok, None, "secret", 512)
    messages = api.parse_messages({"messages": [{"role": "user", "content": "07+45="}]})
    n = 2000
    return alternate({"template + tokenizer": lambda: [api.render_prompt(tok, messages, None) for _ in range(n)],
                      "reused ids": lambda: [gw._render("episode", "agent", messages, None) for _ in range(n)]}, rounds, n)


AIOHTTP_SERVER = """
import asyncio
from aiohttp import web
async def chat(request):
    return web.json_response({"n": len(await request.json())})
async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def request_writes(rounds: int) -> dict:
    """The server's CPU per chat-sized request (an aiohttp app reading its JSON, as the gateway
    does), sent as http.client sends it (headers, then body: two segments) or in one write."""
    import http.client

    import psutil

    from actorjet.runtime import http_json
    from actorjet_agents import arithmetic

    server = subprocess.Popen([sys.executable, "-c", AIOHTTP_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port, proc = int(server.stdout.readline()), psutil.Process(server.pid)
        body = json.dumps({"model": "m", "messages": arithmetic.messages(next(arithmetic.tasks(0))),
                           "max_tokens": 4, "temperature": 1.0}).encode()
        headers = {"Content-Type": "application/json", "Authorization": "Bearer " + "k" * 64}
        n, spent = 1000, {"two writes (http.client)": 0.0, "one write": 0.0}
        kinds = {"two writes (http.client)": http.client.HTTPConnection, "one write": http_json.HTTPConnection}
        for _ in range(rounds):
            for name, kind in kinds.items():
                conn = kind("127.0.0.1", port)
                start = sum(proc.cpu_times()[:2])
                for _ in range(n):
                    conn.request("POST", "/v1/chat/completions", body, headers)
                    conn.getresponse().read()
                spent[name] += sum(proc.cpu_times()[:2]) - start
                conn.close()
        return {name: 1000 * s / (rounds * n) for name, s in spent.items()}
    finally:
        server.kill()
        server.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    args = parse(ap, {"rounds": 1})
    sample, sizes, prefills = engine_batches(args.rounds)
    results = {"sdk call (ms per call)": sdk_call(args.rounds),
               "engine sampling (ms per 128 requests)": sample,
               "engine batch size (ms per 128 requests)": sizes,
               "engine prefill of a group's prompt (ms per 128 requests)": prefills,
               "engine prefix shared by 64 prompts (ms per batch)": engine_prefix(args.rounds),
               "engine wakeups (ms per 64-request call)": engine_wakeups(args.rounds),
               "gateway prompt (ms per call)": gateway_prompt(args.rounds),
               "gateway request read (server CPU ms per call)": request_writes(args.rounds)}
    rows = []
    for piece, variants in results.items():
        (old, before), (new, after) = variants.items()
        rows.append((piece, f"{old}: {before:.3f}", f"{new}: {after:.3f}", f"{100 * (after - before) / before:+.0f}%"))
    table(rows, ("piece", "before", "after", "change"))
    write("rollout_costs", {"rounds": args.rounds, "cpu_ms": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
