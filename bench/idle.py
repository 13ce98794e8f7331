"""What a swarm costs when it starts and when it idles: CPU per process of a head that serves
a model, with a joined node, and no work.

    python bench/idle.py [--settle 15] [--seconds 30]

A head is often idle: started before its job, between runs, with its runners gone.  Every
actor that polls (the learner for batches, the gateway for client-mode events, thespian's own
wakeups) then spends CPU on nothing, on a laptop as on a shared server.  This starts
`actorjet start --tree supervisors/default.toml` (the quickstart's model and task, no runner:
it waits for nodes that bring runners) and joins a node with no runner slot (the CPU each
start took is reported too), waits
``--settle`` seconds (the learner and the gateway slow their polling after 10 s with nothing
to do), and reads every process's CPU over ``--seconds``.  Prints a table and writes
bench/results/idle.json (``--label``: another name).  Target: the whole swarm under 10% of one core.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import cpu_seconds, parse, table, write  # noqa: E402
from swarm import Swarm, pid_of  # noqa: E402

ACTORS = ["registry", "model.policy/engine", "model.policy/gateway", "model.policy/learner",
          "runners/runner-head-0", "runners/runner-head-1"]


def cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    return cpu_seconds({p.pid: p.pid for p in procs})


def processes(env: dict) -> list[psutil.Process]:
    """This run's processes whose environment has every item of ``env``."""
    found = []
    for p in psutil.process_iter():
        try:
            mine = p.environ()
            if all(mine.get(k) == v for k, v in env.items()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after start before measuring")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    ap.add_argument("--label", default="idle", help="results file name (bench/results/LABEL.json)")
    args = parse(ap, {"settle": 12.0, "seconds": 5.0})
    with tempfile.TemporaryDirectory() as tmp:
        swarm = Swarm(Path(tmp))
        try:
            _, port, token = swarm.head(Path(tmp) / "run", str(HERE.parent / "supervisors" / "default.toml"))
            names = {pid_of(port, path): path.split("/")[-1].replace("-head-", " ") for path in ACTORS}
            home = {"ACTORJET_HOME": swarm.env["ACTORJET_HOME"]}
            head_start = sum(cpu_s(processes(home)).values())        # every actor answered
            on_node = {**home, "ACTORJET_BENCH_NODE": "1"}
            swarm.join(port, token, "idle-node", slots=0, env={"ACTORJET_BENCH_NODE": "1"})   # no runner: no work
            join = sum(cpu_s(processes(on_node)).values())
            time.sleep(args.settle)
            procs, node = processes(home), {p.pid for p in processes(on_node)}
            before = cpu_s(procs)
            time.sleep(args.seconds)
            after = cpu_s(procs)
        finally:
            swarm.cleanup()
            left = len(swarm.leftovers())
    share = {}
    for pid, spent in after.items():
        name = "joined node" if pid in node else names.get(pid, "head, admin and supervisors")
        share[name] = share.get(name, 0.0) + 100 * (spent - before.get(pid, spent)) / args.seconds
    total = sum(share.values())
    rows = [(name, f"{pct:.1f}%") for name, pct in sorted(share.items(), key=lambda kv: -kv[1])]
    table(rows + [("the whole swarm", f"{total:.1f}%  (target < 10%)")], ("idle: process", "% of one core"))
    table([("a head with the quickstart's model, until every actor answers", f"{head_start:.2f}"),
           ("a CPU-only node's `actorjet join`", f"{join:.2f}")], ("starting", "CPU-s"))
    write(args.label, {"settle_s": args.settle, "seconds": args.seconds, "percent_of_a_core": share,
                       "total_percent_of_a_core": total, "target_percent": 10,
                       "start_cpu_s": {"head_with_model": head_start, "cpu_node_join": join},
                       "leftover_processes": left})
    if left:
        sys.exit(f"{left} processes were left behind")


if __name__ == "__main__":
    main()
