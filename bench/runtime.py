"""Runtime benchmark: restart latency, node-loss detection, registry round trip, orphans,
and what authenticating every actor frame costs.

    python bench/runtime.py [--restarts 30] [--losses 3] [--rounds 2] [--quickstart-steps 40]

Restart latency and the registry round trip are measured with signed frames (as ActorJet
always runs) and unsigned (thespian's plain pickle, for comparison only: the bench replaces
``frames.install`` in a child process), in interleaved rounds of fresh processes; so is the
quickstart's learner step time (one short quickstart each).  Prints a
table and writes bench/results/runtime.json.  Everything runs on 127.0.0.1 and every process
it starts is killed at the end (it counts what is left: must be 0).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import actorjet  # noqa: E402,F401
from common import parse, write  # noqa: E402
from actorjet.runtime import messages as m  # noqa: E402
from actorjet.runtime.head import Head, attach_root, status  # noqa: E402
from actorjet.runtime.tree_spec import load_tree  # noqa: E402
from swarm import Swarm, free_port, wait_until  # noqa: E402

TREES = HERE.parent / "tests" / "trees"


def restart_latency(tmp: Path, n: int) -> tuple[list[float], list[float]]:
    """SIGKILL a probe child n times; time until its replacement answers a ping."""
    head = Head(tmp / "restart", load_tree(TREES / "runtime.toml"), port=free_port())
    head.start()
    latencies, round_trips = [], []
    try:
        def answer(old_addr=None):
            addr = head.lookup("work/b", 1)
            if addr is None or addr == old_addr:
                return None
            reply = head.asys.ask(addr, m.Ping(), 0.5)
            return reply.pid if isinstance(reply, m.Pong) else None
        pid = wait_until(answer, 10)
        for _ in range(n):
            old_addr = head.lookup("work/b", 1)
            os.kill(pid, signal.SIGKILL)
            t0 = time.perf_counter()
            while True:
                new = answer(old_addr)
                if new and new != pid:
                    break
                time.sleep(0.001)
            latencies.append((time.perf_counter() - t0) * 1000)
            pid = new
            time.sleep(1.1)     # stay inside the tree's restart intensity
        registry = head.lookup("registry")
        for _ in range(200):
            t0 = time.perf_counter()
            head.asys.ask(registry, m.GetStatus(), 5)
            round_trips.append((time.perf_counter() - t0) * 1000)
    finally:
        head.stop()
    return latencies, round_trips


def node_loss(tmp: Path, trials: int, node_timeout: float) -> tuple[list[float], int]:
    """SIGKILL a joined node; time until the registry reports it lost and the runner moved."""
    swarm = Swarm(tmp)
    detections, orphans = [], 0
    try:
        for trial in range(trials):
            _, port, token = swarm.head(tmp / f"loss{trial}", str(TREES / "nodes.toml"),
                                        node_timeout=node_timeout)
            victim, vport = swarm.join(port, token, f"a{trial}")
            wait_until(lambda: any(r["node_id"] for r in status(*attach_root(port))["runners"]), 20)
            swarm.join(port, token, f"b{trial}")
            wait_until(lambda: sum(1 for n in status(*attach_root(port))["nodes"] if not n["head"]) == 2, 10)
            t0 = time.perf_counter()
            swarm.kill_system(vport, victim)

            def lost():
                data = status(*attach_root(port))
                return any(n["name"] == f"a{trial}" and not n["alive"] for n in data["nodes"])
            wait_until(lost, 30, interval_s=0.05)
            detections.append(time.perf_counter() - t0)
        # head restart: the member's orphaned runner must be stopped
        run = tmp / "restart-head"
        head, port, token = swarm.head(run, str(TREES / "nodes.toml"), node_timeout=node_timeout)
        node, nport = swarm.join(port, token, "member")
        wait_until(lambda: any(r["node_id"] for r in status(*attach_root(port))["runners"]), 20)
        from actorjet.runtime import system
        before = {p.pid for p in system.system_processes(nport)}
        swarm.kill_system(port, head)
        swarm.head(run, str(TREES / "nodes.toml"), port=port, node_timeout=node_timeout)
        wait_until(lambda: any(r["node_id"] for r in status(*attach_root(port))["runners"]), 30)
        time.sleep(2)
        after = [p for p in system.system_processes(nport) if p.status() != "zombie"]
        orphans = max(0, len(after) - len(before))
    finally:
        swarm.cleanup()
        left = len(swarm.leftovers())
    return detections, orphans + left


def signing_rounds(restarts: int, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Restart latency and registry round trips, signed and unsigned, each round in fresh
    processes (a process that installed the signer stays signed), interleaved."""
    import subprocess

    out = {"signed": ([], []), "unsigned": ([], [])}
    for _ in range(rounds):
        for mode in ("signed", "unsigned"):
            child = subprocess.run([sys.executable, __file__, "--child", mode, "--restarts", str(restarts),
                                    "--quickstart-steps", "0"],
                                   capture_output=True, text=True, timeout=600, check=True)
            lat, rtt = json.loads(child.stdout.strip().splitlines()[-1])
            out[mode][0].extend(lat)
            out[mode][1].extend(rtt)
    return out


def child(mode: str, restarts: int, quickstart_steps: int) -> None:
    if mode == "unsigned":
        from actorjet.runtime import frames
        frames.install = lambda token: None          # for comparison only: thespian's own pickle
    with tempfile.TemporaryDirectory() as tmp:
        if quickstart_steps:
            print(json.dumps(quickstart_step_time(Path(tmp), quickstart_steps)))
        else:
            print(json.dumps(restart_latency(Path(tmp), restarts)))


def quickstart_step_time(tmp: Path, steps: int) -> list[float]:
    """The quickstart's learner step times (s), steps after the first five (warm-up)."""
    import contextlib
    import io

    from actorjet.monitor import metrics
    from actorjet.cli.main import main as cli

    with contextlib.redirect_stdout(io.StringIO()):
        cli(["quickstart", "--steps", str(steps), "--run-dir", str(tmp / "qs")])
    train = [r for r in metrics.read(tmp / "qs") if r.get("kind") == "train"]
    return [r["step_time_s"] for r in train[5:]]


def quickstart_rounds(steps: int, rounds: int) -> dict[str, list[float]]:
    import subprocess

    out: dict[str, list[float]] = {"signed": [], "unsigned": []}
    for _ in range(rounds):
        for mode in ("signed", "unsigned"):
            child = subprocess.run([sys.executable, __file__, "--child", mode, "--quickstart-steps", str(steps)],
                                   capture_output=True, text=True, timeout=900, check=True)
            out[mode].extend(json.loads(child.stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=30, help="restarts per round and mode")
    ap.add_argument("--losses", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved signed/unsigned rounds")
    ap.add_argument("--node-timeout", type=float, default=6.0, help="the default of `actorjet start`")
    ap.add_argument("--quickstart-steps", type=int, default=40,
                    help="steps of each signed/unsigned quickstart whose step times are compared (0: skip)")
    ap.add_argument("--child", choices=["signed", "unsigned"], help=argparse.SUPPRESS)
    args = parse(ap, {"restarts": 3, "losses": 1, "rounds": 1, "quickstart_steps": 6})
    if args.child:
        child(args.child, args.restarts, args.quickstart_steps)
        return
    modes = signing_rounds(args.restarts, args.rounds)
    quick = quickstart_rounds(args.quickstart_steps, 1) if args.quickstart_steps else {}
    lat, rtt = modes["signed"]
    with tempfile.TemporaryDirectory() as tmp:
        det, orphans = node_loss(Path(tmp), args.losses, args.node_timeout)
    signing = {}
    for mode, (m_lat, m_rtt) in modes.items():
        signing[mode] = {"restart_latency_median_ms": statistics.median(m_lat),
                         "registry_round_trip_mean_ms": statistics.mean(m_rtt),
                         "registry_round_trip_median_ms": statistics.median(m_rtt), "n": len(m_lat)}
    for mode, times in quick.items():
        signing[mode]["quickstart_step_median_s"] = statistics.median(times)
    slower = {k: signing["signed"][k] / signing["unsigned"][k] - 1
              for k in ("restart_latency_median_ms", "registry_round_trip_median_ms", "quickstart_step_median_s")
              if k in signing["signed"]}
    result = {
        "restart_latency_ms": {"median": statistics.median(lat), "p90": sorted(lat)[int(0.9 * len(lat)) - 1],
                               "max": max(lat), "n": len(lat)},
        "node_loss_detection_s": {"median": statistics.median(det), "max": max(det), "n": len(det),
                                  "node_timeout_s": args.node_timeout},
        "registry_round_trip_ms": {"mean": statistics.mean(rtt), "p99": sorted(rtt)[int(0.99 * len(rtt)) - 1]},
        "orphans_after_head_restart_and_cleanup": orphans,
        "signing": {**signing, "signed_slower_by": slower},
        "targets": {"restart_latency_median_ms": "< 100", "node_loss_s": "<= 10", "orphans": 0,
                    "signed_slower_by": "<= 10%"},
    }
    rows = [("restart latency (kill → answering)", f"median {result['restart_latency_ms']['median']:.1f} ms, "
             f"max {result['restart_latency_ms']['max']:.1f} ms", "< 100 ms median"),
            ("node loss detected", f"median {statistics.median(det):.2f} s, max {max(det):.2f} s", "<= 10 s"),
            ("registry round trip", f"mean {result['registry_round_trip_ms']['mean']:.2f} ms", "-"),
            ("orphan processes", str(orphans), "0")]
    for key, label, unit in (("restart_latency_median_ms", "restart latency median", "ms"),
                             ("registry_round_trip_median_ms", "registry round trip median", "ms"),
                             ("quickstart_step_median_s", "quickstart step time median", "s")):
        if key in slower:
            rows.append((f"{label}: signed vs unsigned", f"{signing['signed'][key]:.3f} vs "
                         f"{signing['unsigned'][key]:.3f} {unit} ({100 * slower[key]:+.1f}%)",
                         "<= +10%" if unit == "ms" else "within noise"))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':<40}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:<40}  {target}")
    write("runtime", result)


if __name__ == "__main__":
    main()
