"""Run any behavior of these examples in client mode: your process drives the episodes.

    python -m actorjet_agents.examples.client_mode actorjet_agents.examples.langgraph_react GATEWAY_URL --token T

(For the OpenAI Agents SDK example from a folder where Python finds the SDK first, the same
works: agents/__init__.py makes both packages importable.)
"""
from __future__ import annotations

import argparse
import importlib


def main() -> None:
    import actorjet
    from actorjet_agents import arithmetic, calculator

    p = argparse.ArgumentParser(description="Drive episodes of an example agent against a swarm's gateway "
                                            "(client mode) and print each reward.")
    p.add_argument("module", help="e.g. actorjet_agents.examples.langgraph_react (its `behavior` is run)")
    p.add_argument("gateway", help="a gateway URL, as `actorjet status` lists it")
    p.add_argument("--token", help="the cluster token (default: $ACTORJET_TOKEN)")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--task", choices=("arithmetic", "calculator"), default="calculator",
                   help="arithmetic: 2-digit sums (tiny-arith); calculator: word problems with a tool (a chat model)")
    args = p.parse_args()
    from actorjet.config import examples_name

    behavior = importlib.import_module(examples_name(args.module)).behavior
    swarm = actorjet.connect(args.gateway, token=args.token)
    tasks = (arithmetic if args.task == "arithmetic" else calculator).tasks(0)
    for i in range(args.episodes):
        task = next(tasks)
        with swarm.episode(task=task) as ep:
            ep.reward = behavior(task, ep.llm)
        print(f"episode {i}: reward {ep.reward}", flush=True)


if __name__ == "__main__":
    main()
