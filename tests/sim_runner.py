"""A simulated outbound runner for tests and bench/control_plane.py: it speaks the door's
protocol (docs/multi-host.md) with a zero-work behavior, so many of them fit one process
(asyncio).  Lease one group, store its rewards at every gateway (the body real runners send,
runner/results.py), report the lease done to the door; again, while ``more()`` says so."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from actorjet.runner.results import rewards_body


async def run(session, door: str, token: str, name: str, more: Callable[[int], bool], out: dict) -> None:
    """``more(leases this runner got)``: go on?  ``out`` gathers, over every runner of the
    process: latency (s per lease request), leases, episodes, refused, no_work, busy."""
    auth, mine = {"Authorization": f"Bearer {token}"}, 0
    while more(mine):
        t0 = time.perf_counter()
        async with session.post(f"{door}/v1/actorjet/leases", json={"runner_id": name, "max_groups": 1},
                                headers=auth) as r:
            answer = await r.json()
        out["latency"].append(time.perf_counter() - t0)
        out["busy"] += answer.get("reason") == "registry busy"
        if not answer.get("leases"):
            out["no_work"] += 1
            await asyncio.sleep(min(float(answer.get("retry_s", 0.05)), 0.2))
            continue
        for lease in answer["leases"]:
            mine += 1
            out["leases"] += 1
            good = [{"episode_id": e["episode_id"], "reward": float(m % 2)}
                    for e, m in zip(lease["episodes"], lease["members"])]
            refused: set = set()
            for url in lease["urls"].values():
                async with session.post(url.removesuffix("/v1") + "/v1/actorjet/results",
                                        json=rewards_body(lease, good)) as r:
                    refused |= set((await r.json()).get("refused", [])) if r.status == 200 else {g["episode_id"] for g in good}
            results = [{"episode_id": g["episode_id"], **({"error": "refused"} if g["episode_id"] in refused else {})}
                       for g in good]
            async with session.post(f"{door}/v1/actorjet/results", headers=auth,
                                    json={"runner_id": name, "lease_id": lease["lease_id"], "results": results}) as r:
                await r.read()
            out["episodes"] += len(results) - len(refused)
            out["refused"] += len(refused)


def counters() -> dict:
    return {"latency": [], "leases": 0, "episodes": 0, "refused": 0, "no_work": 0, "busy": 0}
