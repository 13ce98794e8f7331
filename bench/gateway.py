"""Gateway throughput: completions/s at 1 and at 16 concurrent clients (real actors).

    python bench/gateway.py [--requests 400] [--model tiny-arith]

Starts an embedded head (engine and gateway are separate actor processes), then sends chat
completions with the `openai` SDK from 1 and from 16 threads.  Target: ≥ 4x at 16.
Writes bench/results/gateway.json.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from actorjet import signing  # noqa: E402
from actorjet.runner.llm import LLM  # noqa: E402
from common import parse, start_head, table, wait_for_service, write  # noqa: E402


def drive(url: str, token: str, concurrency: int, requests: int, max_tokens: int, tag: str) -> float:
    def one(i: int) -> int:
        # the runners' helper: one pooled client per thread, a fresh episode key per request
        client = LLM({"policy": url}, signing.mint_key(token, f"{tag}.{i}")).client()
        reply = client.chat.completions.create(model="policy", max_tokens=max_tokens, temperature=1.0,
                                               messages=[{"role": "user", "content": f"{i % 100:02d}+17="}])
        return len(reply.choices)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(min(requests, 2 * concurrency))))          # warm-up
        t0 = time.perf_counter()
        done = sum(pool.map(one, range(requests)))
    return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--max-tokens", type=int, default=8)
    args = parse(ap, {"requests": 32, "max_tokens": 4})
    job = {"models": [{"name": "policy", "source": args.model}], "train": {"steps": 1}}
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp), job)
        try:
            wait_for_service(head, "policy", "engine")
            url = wait_for_service(head, "policy", "gateway")
            token = head.token
            rates = {c: drive(url, token, c, args.requests if c > 1 else args.requests // 4, args.max_tokens, f"c{c}")
                     for c in (1, 4, 16)}
        finally:
            head.stop()
    rows = [(c, f"{r:.1f}", f"{r / rates[1]:.2f}x") for c, r in rates.items()]
    table(rows, ("concurrent clients", "completions/s", "vs 1 client"))
    ratio = rates[16] / rates[1]
    print(f"16 concurrent / 1 client = {ratio:.2f}x (target >= 4x)")
    write("gateway", {"model": args.model, "max_tokens": args.max_tokens, "completions_per_s": rates,
                      "ratio_16_vs_1": ratio, "target": ">= 4x"})


if __name__ == "__main__":
    main()
