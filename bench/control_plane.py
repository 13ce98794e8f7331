"""The control plane under many agents: simulated runners against one head (issue 33).

    python bench/control_plane.py [--runners 10,100,300,1000] [--seconds 20] [--processes 2] [--kind outbound|thespian|both]

A real head (registry, door, a tiny-arith model's gateway, engine and learner) and simulated
runners that speak the outbound protocol (docs/multi-host.md) with zero-work behaviors: each
runner asks the door for one group, stores its rewards at the gateway (one POST per lease, as
runner/results.py does), and reports the lease done to the door, then asks again.  Many
runners share a process (asyncio, one HTTP connection pool per process), so 1,000 runners
are ``--processes`` processes, not 1,000.  No LLM call is made: what is measured is the swarm's
bookkeeping (leases, the episode store's rewards, results, groups judged complete), not the data plane.

``--kind thespian`` runs real runner actors instead (runner/core.py, the code every joined
node runs), with agents/zero_work.py as their behavior: N "runners" are the head's 2 runner
slots with N/2 episodes in flight each (runner_concurrency), one head per count.  Their
lease latency is not seen from outside, so that row has episodes/s and CPU only.

Per runner count: leases granted per second, episodes finished per second (their rewards
stored and their lease reported), lease latency (p50 / p99, from the runner's side), and the
registry's CPU seconds per 1,000 episodes (psutil, the registry actor's process).  Prints a
table and writes bench/results/control_plane.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import sim_runner  # noqa: E402  - the simulated outbound runner the tests use too
from common import cpu_seconds, parse, table, write  # noqa: E402

GROUP_SIZE = 8
JOB = {"models": [{"name": "policy", "source": "tiny-arith", "eval_every": 10 ** 6, "checkpoint_every": 10 ** 6}],
       "tasks": [{"name": "arithmetic", "source": "actorjet_agents.arithmetic", "behavior": "actorjet_agents.arithmetic:behavior"}],
       # a window the learner never closes: leases are bounded by the runners alone
       "train": {"group_size": GROUP_SIZE, "groups_per_step": 256, "max_staleness": 100_000, "steps": 10 ** 6,
                 "lease_timeout_s": 600.0}}


def _client(door: str, token: str, runners: int, offset: int, seconds: float, result_file: str) -> None:
    """A process of ``runners`` simulated runners (asyncio), for ``seconds``."""
    import aiohttp

    async def main() -> dict:
        out = sim_runner.counters()
        connector = aiohttp.TCPConnector(limit=runners)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            until = time.time() + seconds
            await asyncio.gather(*(sim_runner.run(session, door, token, f"sim-{offset + k}", lambda _: time.time() < until,
                                                  out) for k in range(runners)))
        return out

    Path(result_file).write_text(json.dumps(asyncio.run(main())))


def measure(head, door: str, runners: int, seconds: float, processes: int, tmp: Path) -> dict:
    actors = {a["path"].removeprefix("root/"): a["pid"] for a in head.status()["actors"]}
    cpu = lambda: cpu_seconds(actors)  # noqa: E731
    cpu0 = cpu()
    per = [runners // processes + (1 if k < runners % processes else 0) for k in range(processes)]
    files = [tmp / f"cp-{runners}-{k}.json" for k in range(processes)]
    procs = [mp.get_context("spawn").Process(target=_client, args=(door, head.token, n, sum(per[:k]), seconds, str(f)))
             for k, (n, f) in enumerate(zip(per, files)) if n]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(seconds + 120)
    wall = time.perf_counter() - t0
    used = {path: t - cpu0[path] for path, t in cpu().items() if path in cpu0}
    parts = [json.loads(f.read_text()) for f in files if f.exists()]
    latency = sorted(x for part in parts for x in part["latency"])
    episodes = sum(p["episodes"] for p in parts)
    q = lambda f: latency[min(len(latency) - 1, int(f * len(latency)))] * 1000 if latency else None  # noqa: E731
    return {"runners": runners, "seconds": seconds, "wall_s": wall, "leases_per_s": sum(p["leases"] for p in parts) / seconds,
            "episodes_per_s": episodes / seconds, "no_work_answers": sum(p["no_work"] for p in parts),
            "refused_episodes": sum(p["refused"] for p in parts),
            "lease_p50_ms": q(0.5), "lease_p99_ms": q(0.99), "lease_mean_ms": statistics.fmean(latency) * 1000 if latency else None,
            "registry_cpu_s_per_1k_episodes": used["registry"] / episodes * 1000 if episodes else None,
            "cpu_s_per_1k_episodes": {path: round(t / episodes * 1000, 4) for path, t in sorted(used.items())
                                      if episodes and t > 0.01},
            "busiest_actor": max(used, key=used.get) if used else None,
            "busiest_actor_cores": max(used.values()) / wall if used else None}


def measure_thespian(runners: int, seconds: float, tmp: Path) -> dict:
    """Real runner actors with a zero-work behavior: episodes finished per second, from the
    registry's own counter, and CPU per 1,000 episodes of every actor."""
    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.system import free_port
    from actorjet.runtime.tree_spec import load_tree

    spec = json.loads(json.dumps(JOB))
    spec["tasks"][0]["behavior"] = "actorjet_agents.zero_work:behavior"
    spec["train"]["runner_concurrency"] = max(1, runners // 2)
    job = prepare(normalize(spec, "bench"))
    head = Head(tmp / f"run-thespian-{runners}", load_tree(tree_path("default.toml")), job, port=free_port(), slots=2)
    head.start()
    try:
        completed = lambda: head.status()["episodes"]["completed"]  # noqa: E731
        deadline = time.time() + 120
        while completed() < 100:                        # warm-up: runners up, behaviors loaded
            if time.time() > deadline:
                raise SystemExit("thespian runners finished no episode in 120 s")
            time.sleep(0.5)
        actors = {a["path"].removeprefix("root/"): a["pid"] for a in head.status()["actors"]}
        cpu = lambda: cpu_seconds(actors)  # noqa: E731
        cpu0, done0, t0 = cpu(), completed(), time.perf_counter()
        time.sleep(seconds)
        episodes, wall = completed() - done0, time.perf_counter() - t0
        used = {path: t - cpu0[path] for path, t in cpu().items() if path in cpu0}
    finally:
        head.stop()
    runner_cpu = sum(t for path, t in used.items() if path.startswith("runners/"))
    return {"kind": "thespian", "runners": runners, "seconds": seconds, "wall_s": wall, "episodes_per_s": episodes / wall,
            "leases_per_s": episodes / wall / GROUP_SIZE, "lease_p50_ms": None, "lease_p99_ms": None,
            "registry_cpu_s_per_1k_episodes": used.get("registry", 0) / episodes * 1000 if episodes else None,
            "runner_actors_cpu_s_per_1k_episodes": runner_cpu / episodes * 1000 if episodes else None,
            "cpu_s_per_1k_episodes": {path: round(t / episodes * 1000, 4) for path, t in sorted(used.items())
                                      if episodes and t > 0.01},
            "busiest_actor": max(used, key=used.get) if used else None,
            "busiest_actor_cores": max(used.values()) / wall if used else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runners", default="10,100,300,1000", help="runner counts to sweep (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per runner count (default %(default)s)")
    ap.add_argument("--processes", type=int, default=2, help="client processes the runners share (default %(default)s)")
    ap.add_argument("--kind", choices=("outbound", "thespian", "both"), default="outbound",
                    help="simulated outbound runners, real thespian runner actors, or both (default %(default)s)")
    args = parse(ap, {"runners": "4", "seconds": 2.0, "processes": 1, "kind": "both"})
    try:
        counts = [int(x) for x in args.runners.split(",")]
    except ValueError:
        ap.error(f"--runners must be comma-separated whole numbers, got {args.runners!r}")
    if not counts or min(counts) < 1 or args.seconds <= 0 or args.processes < 1:
        ap.error("--runners must be >= 1 each, --seconds > 0, --processes >= 1")

    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.system import free_port
    from actorjet.runtime.tree_spec import load_tree

    rows, results = [], []

    def row(r: dict) -> None:
        results.append(r)
        latency = f"{r['lease_p50_ms']:.1f} / {r['lease_p99_ms']:.1f}" if r["lease_p50_ms"] is not None else "-"
        rows.append((r.get("kind", "outbound"), r["runners"], f"{r['leases_per_s']:.0f}", f"{r['episodes_per_s']:.0f}",
                     latency, f"{r['registry_cpu_s_per_1k_episodes']:.3f}" if r["registry_cpu_s_per_1k_episodes"] else "-"))
        print(json.dumps(r), flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for n in counts if args.kind in ("thespian", "both") else []:
            row(measure_thespian(n, args.seconds, tmp))
        if args.kind == "thespian":
            counts = []           # (no outbound head)
        if counts:
            job = prepare(normalize(JOB, "bench"))
            door_port = free_port()
            head = Head(tmp / "run", load_tree(tree_path("default.toml")), job, port=free_port(), door_port=door_port)
            head.start()
            try:
                door = f"http://127.0.0.1:{door_port}"
                deadline = time.time() + 120
                while "gateway" not in head.status().get("services", {}).get("policy", {}):
                    if time.time() > deadline:
                        raise SystemExit("the gateway did not come up")
                    time.sleep(0.2)
                measure(head, door, 4, 3.0, 1, tmp)             # warm-up: connections, first leases
                for n in counts:
                    row({"kind": "outbound", **measure(head, door, n, args.seconds, args.processes, tmp)})
            finally:
                head.stop()
    table(rows, ("runners", "count", "leases/s", "episodes/s", "lease p50 / p99 ms", "registry CPU s / 1k episodes"))
    write("control_plane" if args.kind == "outbound" else f"control_plane-{args.kind}",
          {"cores": os.cpu_count(), "group_size": GROUP_SIZE, "processes": args.processes, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
