"""Chaos benchmark: a real training run while everything that can fail is made to fail.

    python bench/chaos.py [--steps 60] [--seed 0]

Every node is its own host: the head and each joined node run in their own network namespace
with their own address (tests/hosts.py; needs root and `ip netns`).  Two joined nodes train tiny-arith with `agents/flaky_arithmetic.py` (the environment
raises in 5% and hangs in 1% of episodes).  At random learner steps the bench SIGKILLs
runners, the gateway (it writes the episode store), the learner (twice), a whole node (a new
one joins), and the head (then `actorjet start` again on the same run directory and port).
At the end it checks the model's episode store (and the archive retention moved trained groups to:
the job keeps trajectories) and prints faults injected / survived, episodes lost, recovery times and whether
reward still improved.  Writes bench/results/chaos.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import actorjet  # noqa: E402,F401
import hosts  # noqa: E402
import jobs  # noqa: E402
from common import parse, table, write  # noqa: E402
from swarm import REPO, Swarm, wait_until  # noqa: E402

def job(steps: int) -> str:
    return jobs.tiny_arith(steps, group_size=8, groups_per_step=8, runner_concurrency=16,
                           behavior="actorjet_agents.flaky_arithmetic:behavior", model="lr = 1e-4\ncheckpoint_every = 5",
                           train="lease_timeout_s = 4.0\nepisode_retries = 3\nkeep_trajectories = true")


GROUP = 8


class Chaos:
    def __init__(self, swarm: Swarm, net: hosts.Network, tmp: Path, steps: int):
        self.swarm, self.net, self.tmp, self.steps = swarm, net, tmp, steps
        self.run = tmp / "run"
        self.job = tmp / "job.toml"
        self.job.write_text(job(steps))
        self.tree = str(REPO / "supervisors" / "default.toml")
        self.head_host = net.host("head")
        self.head, self.port, self.token = swarm.head(self.run, self.tree, host=self.head_host,
                                                      extra=["--config", str(self.job)])
        self.nodes: dict[str, hosts.Host] = {}
        self.accounted = 0             # groups the registries issued, less dropped and open, over head restarts
        self.injected: list[str] = []

    def status(self) -> dict:
        return self.swarm.ctl(self.head_host, "status", self.port)

    def pid_of(self, path: str) -> int | None:
        return self.swarm.ctl(self.head_host, "pid", self.port, path)["pid"]

    def step(self) -> int:
        models = self.status()["models"]
        return models[0]["learner_step"] if models else 0

    def join(self, name: str) -> None:
        host = self.nodes[name] = self.net.host(name)
        self.swarm.join(self.port, self.token, name, slots=2, head_host=self.head_host.ip, host=host)

    def wait_step(self, n: int) -> None:
        wait_until(lambda: self.step() >= n, 300, interval_s=0.2, what=f"learner step {n}")

    # -- faults ---------------------------------------------------------------------------
    def kill_runner(self, runner_id: str) -> float:
        """SIGKILL a runner; seconds until its replacement answers."""
        # (a runner of a node that just joined may not be up yet: the kill waits for it)
        pid = wait_until(lambda: self.pid_of(f"runners/{runner_id}"), 60, interval_s=0.2, what=f"{runner_id} up")
        os.kill(pid, signal.SIGKILL)
        t0 = time.perf_counter()
        wait_until(lambda: (self.pid_of(f"runners/{runner_id}") or pid) != pid, 60, interval_s=0.02)
        self.injected.append(f"runner {runner_id}")
        return time.perf_counter() - t0

    def kill_actor(self, path: str) -> float:
        """SIGKILL the gateway or the learner; seconds until the next learner step."""
        before = self.status()["models"][0]
        os.kill(self.pid_of(path), signal.SIGKILL)
        t0 = time.perf_counter()

        def stepped():
            now = self.status()["models"][0]
            return now["weight_version"] != before["weight_version"] and now["learner_step"] != before["learner_step"]
        wait_until(stepped, 300, interval_s=0.05, what=f"a learner step after killing {path}")
        self.injected.append(path)
        return time.perf_counter() - t0

    def kill_node(self, name: str, replacement: str) -> None:
        self.swarm.kill_host(self.nodes.pop(name))      # the machine dies: every process on it
        self.join(replacement)
        self.injected.append(f"node {name}")

    def kill_head(self) -> float:
        data = self.status()
        self.accounted += owed(data["groups"])      # each must be complete in the store
        self.swarm.kill_host(self.head_host)
        t0 = time.perf_counter()
        self.head, _, _ = self.swarm.head(self.run, self.tree, port=self.port, host=self.head_host,
                                          extra=["--config", str(self.job)])
        wait_until(lambda: self.status()["models"] and self.status()["models"][0]["learner_step"] > 0,
                   300, interval_s=0.2, what="a learner step after the head restart")
        self.injected.append("head")
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = parse(ap, {"steps": 20})
    rng = random.Random(args.seed)
    os.environ.update(AJ_FLAKY_RAISE="0.05", AJ_FLAKY_HANG="0.01", AJ_FLAKY_HANG_S="20")
    t_start = time.time()
    why = hosts.unavailable()
    if why:
        sys.exit(f"bench/chaos.py runs every node on its own host (network namespace): {why}")
    print("hosts: head and nodes a, b, c each in their own network namespace (own address, own loopback)")
    with tempfile.TemporaryDirectory() as tmp_name:
        swarm, net = Swarm(Path(tmp_name)), hosts.Network()
        try:
            result = run(swarm, net, Path(tmp_name), args.steps, rng)
        except BaseException:
            print(swarm.post_mortem(), flush=True)      # what the swarm said, before cleanup ends it
            raise
        finally:
            swarm.cleanup()
            left = len(swarm.leftovers())
            net.close()
    result.update(leftover_processes=left, wall_s=time.time() - t_start, hosts="network namespaces")
    rows = [("faults injected / survived", f"{result['faults_injected']} / {result['faults_survived']}", "all"),
            ("episodes lost", result["episodes_lost"], "0"),
            ("duplicate episodes in the store", result["duplicate_episodes"], "0"),
            ("store: complete = trained + pending", f"{result['store']['complete']} = {result['store']['trained']}"
             f" + {result['store']['pending']}", "holds"),
            ("groups issued ≤ complete in the store + dropped + open (last head)",
             f"{result['groups_last_epoch']['issued']} ≤ {result['groups_last_epoch']['finished']} + "
             f"{result['groups_last_epoch']['dropped']} + {result['groups_last_epoch']['groups_open']}", "holds"),
            ("runner kill → replacement answering (p50 / max)",
             f"{result['runner_recovery_s']['p50']:.2f} / {result['runner_recovery_s']['max']:.2f} s", "-"),
            ("learner kill → its next step (each)", ", ".join(f"{x:.1f}" for x in result["learner_recovery_s"]) + " s", "-"),
            ("gateway kill → next step", f"{result['gateway_recovery_s']:.1f} s", "-"),
            ("head kill + restart → next step", f"{result['head_recovery_s']:.1f} s", "-"),
            ("learner steps reached", f"{result['final_step']} / {args.steps}", "all"),
            ("reward first 10 → last 10 steps", f"{result['reward_first']:.3f} → {result['reward_last']:.3f}", "rises"),
            ("episode faults (aborted by cause)", json.dumps(result["aborted_by_cause_last_epoch"]), "-"),
            ("processes left after cleanup", result["leftover_processes"], "0")]
    table(rows, ("measure", "result", "target"))
    write("chaos", result)
    if result["leftover_processes"]:
        sys.exit(f"bench/chaos.py: {result['leftover_processes']} processes outlived the bench")



def owed(groups: dict) -> int:
    """Of one head's issued groups, those that must be complete in the store: all but the
    dropped and the still open (status's ``groups``; the registry keeps no count of finished
    groups, the store's word is the only one)."""
    return groups["issued"] - groups["dropped"] - groups["groups_open"]

def run(swarm: Swarm, net: hosts.Network, tmp: Path, steps: int, rng: random.Random) -> dict:
    chaos = Chaos(swarm, net, tmp, steps)
    chaos.join("a")
    chaos.join("b")
    at = sorted(rng.sample(range(3, steps - 8), 9))      # the learner steps at which faults happen
    runner_s, learner_s = [], []
    t0 = time.time()

    def at_step(k: int, fault: str) -> None:
        """Wait for the k-th fault's step and say which fault comes (a hung run shows where)."""
        chaos.wait_step(at[k])
        print(f"{time.time() - t0:6.1f} s, step {at[k]}: {fault}", flush=True)

    at_step(0, "SIGKILL runner-a-0")
    runner_s.append(chaos.kill_runner("runner-a-0"))
    at_step(1, "SIGKILL the gateway")
    gateway_s = chaos.kill_actor("model.policy/gateway")
    at_step(2, "SIGKILL the learner")
    learner_s.append(chaos.kill_actor("model.policy/learner"))
    at_step(3, "SIGKILL runner-b-1")
    runner_s.append(chaos.kill_runner("runner-b-1"))
    at_step(4, "node a dies, node c joins")
    chaos.kill_node("a", "c")
    at_step(5, "the head dies and is started again")
    head_s = chaos.kill_head()
    at_step(6, "SIGKILL runner-c-0")
    runner_s.append(chaos.kill_runner("runner-c-0"))
    at_step(7, "SIGKILL the learner")
    learner_s.append(chaos.kill_actor("model.policy/learner"))
    at_step(8, "SIGKILL runner-b-0")
    runner_s.append(chaos.kill_runner("runner-b-0"))
    print(f"{time.time() - t0:6.1f} s: every fault injected, training on to step {steps}", flush=True)
    wait_until(lambda: chaos.status()["training_finished"], 600, interval_s=0.5, what=f"{steps} steps")
    # Count when quiescent: runners finish the groups they hold after training ends.
    snapshot = {}

    def quiet() -> bool:
        snapshot.update(chaos.status())
        return snapshot["groups"]["leases_open"] == 0
    wait_until(quiet, 60, interval_s=0.5, what="no lease open")
    data = snapshot
    accounted = chaos.accounted + owed(data["groups"])
    db = sqlite3.connect(chaos.run / "episodes-policy.sqlite")
    finished, trained = db.execute("SELECT COUNT(*), COUNT(trained_step) FROM groups "
                                   "WHERE complete_at IS NOT NULL").fetchone()
    # a duplicate: a complete group with more members than its size, or an episode in two groups
    (extra,) = db.execute("SELECT COALESCE(SUM(n - size), 0) FROM (SELECT g.size, COUNT(DISTINCT e.member) n "
                          "FROM groups g JOIN episodes e USING (group_id) WHERE g.complete_at IS NOT NULL "
                          "GROUP BY g.group_id) WHERE n > size").fetchone()
    (twins,) = db.execute("SELECT COUNT(*) - COUNT(DISTINCT group_id || '/' || member) FROM episodes "
                          "WHERE reward IS NOT NULL").fetchone()
    (short,) = db.execute("SELECT COUNT(*) FROM (SELECT g.size, COUNT(DISTINCT e.member) n FROM groups g "
                          "JOIN episodes e USING (group_id) WHERE g.complete_at IS NOT NULL "
                          "GROUP BY g.group_id) WHERE n < size").fetchone()
    # Groups trained before the last checkpoint left the store (retention) for the archive.
    in_store = {g for (g,) in db.execute("SELECT group_id FROM groups WHERE complete_at IS NOT NULL")}
    members: dict[str, list] = {}
    archive = chaos.run / "trajectories" / "policy.jsonl"
    for line in (archive.read_text().splitlines() if archive.exists() else []):
        if line.strip():
            episode = json.loads(line)
            members.setdefault(episode["group_id"], []).append(episode["member"])
    retired = {g: m for g, m in members.items() if g not in in_store}
    finished, trained = finished + len(retired), trained + len(retired)
    extra += sum(max(0, len(set(m)) - GROUP) for m in retired.values())
    twins += sum(len(m) - len(set(m)) for m in retired.values())
    short += sum(1 for m in retired.values() if len(set(m)) < GROUP)
    rows = [json.loads(line) for line in (chaos.run / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows if r["kind"] == "train"]
    survived = data["models"][0]["learner_step"] == steps and data["training_finished"]
    return {
        "steps": steps, "final_step": data["models"][0]["learner_step"],
        "faults": chaos.injected, "faults_injected": len(chaos.injected),
        "faults_survived": len(chaos.injected) if survived else 0,
        "episodes_lost": max(0, accounted - finished) * GROUP + short * GROUP,
        "duplicate_episodes": extra,
        "twin_results": twins,      # a member stored twice (a late result and its retry): one of them trains
        "store": {"complete": finished, "trained": trained, "pending": finished - trained},
        "groups_issued_not_dropped_or_open": accounted,
        "runner_recovery_s": {"p50": statistics.median(runner_s), "max": max(runner_s), "n": len(runner_s)},
        "learner_recovery_s": learner_s, "gateway_recovery_s": gateway_s, "head_recovery_s": head_s,
        "reward_first": sum(rewards[:10]) / 10, "reward_last": sum(rewards[-10:]) / 10,
        "aborted_by_cause_last_epoch": data["aborted_by_cause"], "groups_last_epoch": data["groups"],
        "restarts_last_epoch": data["restarts"],
        "env_fault_rates": {"raise": 0.05, "hang": 0.01, "hang_s": 20},
    }


if __name__ == "__main__":
    main()
