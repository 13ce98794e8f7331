"""What an idle head costs: CPU per process of a head that serves a model and has no work.

    python bench/idle.py [--settle 15] [--seconds 30]

A head is often idle: started before its job, between runs, with its runners gone.  Every
actor that polls (the learner for batches, the gateway for client-mode events, thespian's own
wakeups) then spends CPU on nothing, on a laptop as on a shared server.  This starts
`actorjet start --tree supervisors/default.toml` (the quickstart's model, no job), waits
``--settle`` seconds (the learner and the gateway slow their polling after 10 s with nothing
to do), and reads every process's CPU over ``--seconds``.  Prints a table and writes
bench/results/idle.json (``--label``: another name).  Target: the whole head under 10% of one core.
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

from common import parse, table, write  # noqa: E402
from swarm import Swarm, pid_of  # noqa: E402

ACTORS = ["registry", "model.policy/engine", "model.policy/gateway", "model.policy/learner",
          "runners/runner-head-0", "runners/runner-head-1"]


def cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after start before measuring")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    ap.add_argument("--label", default="idle", help="results file name (bench/results/LABEL.json)")
    args = parse(ap, {"settle": 12.0, "seconds": 5.0})
    with tempfile.TemporaryDirectory() as tmp:
        swarm = Swarm(Path(tmp))
        try:
            _, port, _ = swarm.head(Path(tmp) / "run", str(HERE.parent / "supervisors" / "default.toml"))
            names = {pid_of(port, path): path.split("/")[-1].replace("-head-", " ") for path in ACTORS}
            time.sleep(args.settle)
            home = swarm.env["ACTORJET_HOME"]
            procs = []
            for p in psutil.process_iter():
                try:
                    if p.environ().get("ACTORJET_HOME") == home:
                        procs.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            before = cpu_s(procs)
            time.sleep(args.seconds)
            after = cpu_s(procs)
        finally:
            swarm.cleanup()
            left = len(swarm.leftovers())
    share = {}
    for pid, spent in after.items():
        name = names.get(pid, "head, admin and supervisors")
        share[name] = share.get(name, 0.0) + 100 * (spent - before.get(pid, spent)) / args.seconds
    total = sum(share.values())
    rows = [(name, f"{pct:.1f}%") for name, pct in sorted(share.items(), key=lambda kv: -kv[1])]
    table(rows + [("whole head", f"{total:.1f}%  (target < 10%)")], ("process", "% of one core"))
    write(args.label, {"settle_s": args.settle, "seconds": args.seconds, "percent_of_a_core": share,
                   "total_percent_of_a_core": total, "target_percent": 10, "leftover_processes": left})
    if left:
        sys.exit(f"{left} processes were left behind")


if __name__ == "__main__":
    main()
