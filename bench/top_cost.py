"""What watching costs: the quickstart's training with and without `actorjet top` polling at 1 Hz.

    python bench/top_cost.py [--rounds 2] [--steps 40] [--watchers 1]

Each round starts a head on the quickstart's job twice, once with ``--watchers`` pollers
doing exactly what `actorjet top` does (cli/top.py's Poller: the door's status endpoint,
once a second) and once without, in alternating order.  It compares the learner's median
step time (steps after the fifth) and the CPU seconds per step of the registry and
learner processes.  Prints a table and writes bench/results/top_cost.json.  Target: at most
2% more step time.

    python bench/top_cost.py --windows 10 --steps 1500

Between two heads the median step time alone moves by up to 25% on this machine (which
runs are slow has nothing to do with polling), so paired runs give a wide interval.
``--windows S`` measures inside one head instead: the pollers switch on and off every S
seconds, and each "on" window is paired with the "off" window next to it, so both halves of
a pair share the run, its warm caches and the machine's state at that minute.  The change
is the mean of the pairs' ratios of median step time, with its 95% interval.

Step times on 2 busy cores vary by ~15% window to window, more than the effect, so the
windowed run also measures the cost directly: the CPU that watching adds per second (the
registry and door processes in "on" windows minus "off" windows, plus the pollers' own
threads).  Watching can slow the learner by at most that fraction of one core, even if
every extra cycle ran on the learner's core.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import psutil  # noqa: E402

from actorjet.monitor import metrics  # noqa: E402
from actorjet.cli.top import Poller  # noqa: E402
from common import half_width, parse, table, write  # noqa: E402
from jobs import tiny_arith  # noqa: E402
from swarm import REPO, Swarm, wait_until  # noqa: E402

def quickstart_job(steps: int, groups: int = 32) -> str:
    """The quickstart's job (cli/train_cmds.py) as a config file (``groups`` per step: its 32)."""
    return tiny_arith(steps, group_size=8, groups_per_step=groups, runner_concurrency=64,
                      model="checkpoint_every = 1000\nmax_batch = 256", behavior="agents.arithmetic:behavior")

WATCHED = ("root/registry", "root/model.policy/learner")


def start_head(tmp: Path, steps: int, groups: int):
    """A head on the quickstart's job with 2 local runners: (swarm, head port, token, status())."""
    from actorjet.runtime.head import attach_root, status as head_status

    tmp.mkdir(parents=True)
    (tmp / "job.toml").write_text(quickstart_job(steps, groups))
    swarm = Swarm(tmp)
    _, port, token = swarm.head(tmp / "run", str(REPO / "supervisors" / "default.toml"), slots=2,
                                extra=["--config", str(tmp / "job.toml")])
    return swarm, port, token, lambda: head_status(*attach_root(port))


def one_run(tmp: Path, steps: int, watchers: int, groups: int) -> dict:
    swarm, port, token, status = start_head(tmp, steps, groups)
    try:
        wait_until(lambda: status()["models"][0]["learner_step"] >= 5, 300, interval_s=0.5, what="5 steps")
        pids = {a["path"]: a["pid"] for a in status()["actors"] if a["path"] in WATCHED}
        procs = [psutil.Process(p) for p in pids.values()]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        stop, polls, failed = threading.Event(), [0], []

        def watch():
            poller = Poller(f"http://127.0.0.1:{port + 1}", token)
            while not stop.is_set():
                if poller.poll() is not None:
                    polls[0] += 1
                else:
                    failed.append(poller.error)
                stop.wait(1.0)
        threads = [threading.Thread(target=watch, daemon=True) for _ in range(watchers)]
        for t in threads:
            t.start()
        start_step = status()["models"][0]["learner_step"]
        wait_until(lambda: status()["training_finished"], 900, interval_s=1, what=f"{steps} steps")
        stop.set()
        cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0
        train = [r for r in metrics.read(tmp / "run") if r.get("kind") == "train" and r["step"] > 5]
        return {"step_time_median_s": statistics.median(r["step_time_s"] for r in train),
                "cpu_s_per_step": cpu / max(1, steps - start_step), "polls": polls[0],
                "failed_polls": len(failed), "last_failure": failed[-1] if failed else ""}
    finally:
        swarm.cleanup()


def windowed_run(tmp: Path, steps: int, watchers: int, window_s: float, groups: int) -> dict:
    """One head; pollers on and off in alternating windows; step times grouped by window."""
    import time as _time

    swarm, port, token, status = start_head(tmp, steps, groups)
    try:
        wait_until(lambda: status()["models"][0]["learner_step"] >= 10, 300, interval_s=0.5, what="10 steps")
        pids = {a["path"]: a["pid"] for a in status()["actors"] if a["path"] in ("root/registry", "root/door")}
        procs = [psutil.Process(pid) for pid in pids.values()]
        head_cpu = lambda: sum(sum(p.cpu_times()[:2]) for p in procs)  # noqa: E731
        done, on, polls, failed = threading.Event(), threading.Event(), [0], []
        poller_cpu = [0.0]           # CPU seconds of the poller threads, all together

        def watch():
            poller = Poller(f"http://127.0.0.1:{port + 1}", token)
            while not done.is_set():
                if on.wait(0.1):
                    t0 = _time.thread_time()
                    if poller.poll() is not None:
                        polls[0] += 1
                    else:
                        failed.append(poller.error)
                    poller_cpu[0] += _time.thread_time() - t0
                    done.wait(1.0)
        threads = [threading.Thread(target=watch, daemon=True) for _ in range(watchers)]
        for t in threads:
            t.start()
        windows = []            # (start, end, watched, CPU seconds added by head processes and pollers)
        watched = False
        while not status()["training_finished"]:
            start, cpu0, poll0 = _time.time(), head_cpu(), poller_cpu[0]
            (on.set if watched else on.clear)()
            done.wait(window_s)
            windows.append((start, _time.time(), watched, head_cpu() - cpu0 + poller_cpu[0] - poll0))
            watched = not watched
        done.set()
        train = [r for r in metrics.read(tmp / "run") if r.get("kind") == "train" and r["step"] > 10]
        medians, cpu_pairs = [], []
        for (s1, e1, w1, c1), (s2, e2, w2, c2) in zip(windows[0::2], windows[1::2]):
            on_w, off_w = ((c1, e1 - s1), (c2, e2 - s2)) if w1 else ((c2, e2 - s2), (c1, e1 - s1))
            cpu_pairs.append(on_w[0] / on_w[1] - off_w[0] / off_w[1])     # cores added while watched
        for start, end, w, _ in windows:
            # A step belongs to the window it ended in; skip the first second after a switch.
            times = [r["step_time_s"] for r in train if start + 1.0 <= r["time"] < end]
            medians.append((w, statistics.median(times) if len(times) >= 5 else None))
        pairs = []
        for (w1, m1), (w2, m2) in zip(medians[0::2], medians[1::2]):
            if m1 and m2:
                off, on_ = (m1, m2) if not w1 else (m2, m1)
                pairs.append(on_ / off - 1)
        return {"windows": len(windows), "pairs": pairs, "cpu_pairs": cpu_pairs, "poller_cpu_s": poller_cpu[0],
                "polls": polls[0], "failed_polls": len(failed),
                "step_time_median_off_s": statistics.median(m for w, m in medians if m and not w),
                "step_time_median_on_s": statistics.median(m for w, m in medians if m and w)}
    finally:
        swarm.cleanup()


def windowed_main(args) -> int:
    with tempfile.TemporaryDirectory(prefix="aj-topcost-") as tmp:
        out = windowed_run(Path(tmp) / "windows", args.steps, args.watchers, args.windows, args.groups)
    mean, half = half_width(out["pairs"])
    cpu, cpu_half = half_width(out["cpu_pairs"])
    table([("learner step time (median per window)", f"{out['step_time_median_off_s']:.3f} s",
            f"{out['step_time_median_on_s']:.3f} s", f"{100 * mean:+.1f}% ± {100 * half:.1f}",
            f"{len(out['pairs'])} pairs", "<= +2%"),
           ("CPU added by watching (registry + door + pollers)", "-", "-",
            f"{100 * cpu:+.2f}% ± {100 * cpu_half:.2f} of one core", f"{len(out['cpu_pairs'])} pairs",
            "bounds the slowdown")],
          ("measure", "off", f"{args.watchers} top at 1 Hz", "change (95% CI)", "pairs", "target"))
    write("top_cost_windows", {"steps": args.steps, "watchers": args.watchers, "window_s": args.windows,
                               **out, "change": {"mean": mean, "ci95": half},
                               "cpu_added_cores": {"mean": cpu, "ci95": cpu_half}})
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--watchers", type=int, default=1, help="`top`s polling at once (default 1)")
    ap.add_argument("--windows", type=float, default=0,
                    help="measure inside one head: pollers on and off every WINDOWS seconds")
    ap.add_argument("--groups", type=int, default=32, help="groups of 8 per step (default 32, the quickstart's)")
    # (a run measures after step 5; the smoke's steps are a quarter of the quickstart's, its
    # heads' start-up is most of its CPU)
    args = parse(ap, {"rounds": 1, "steps": 8, "groups": 8})
    if args.groups < 1 or args.steps < 7 or args.rounds < 1 or args.watchers < 1:
        ap.error("--groups, --rounds and --watchers take 1 or more, --steps 7 or more (steps after the fifth are measured)")
    if not args.windows >= 0 or (args.windows and args.steps <= 10):       # (NaN fails the first)
        ap.error("--windows takes seconds (0: paired heads), and needs --steps over 10 (windows start after step 10)")
    if args.windows:
        return windowed_main(args)
    runs = {"watched": [], "alone": []}
    with tempfile.TemporaryDirectory(prefix="aj-topcost-") as tmp:
        for i in range(args.rounds):
            order = ("watched", "alone") if i % 2 == 0 else ("alone", "watched")
            for mode in order:
                out = one_run(Path(tmp) / f"{mode}-{i}", args.steps, args.watchers if mode == "watched" else 0,
                              args.groups)
                runs[mode].append(out)
                print(f"round {i + 1} {mode}: {out}", flush=True)
    summary = {mode: {"step_time_median_s": statistics.median(r["step_time_median_s"] for r in rs),
                      "cpu_s_per_step": statistics.median(r["cpu_s_per_step"] for r in rs),
                      "polls": sum(r["polls"] for r in rs)} for mode, rs in runs.items()}
    rows, changes = [], {}
    for key, label in (("step_time_median_s", "learner step time (median)"),
                       ("cpu_s_per_step", "CPU of registry+learner per step")):
        paired = [w[key] / a[key] - 1 for w, a in zip(runs["watched"], runs["alone"])]   # round by round
        mean, half = half_width(paired)
        changes[key] = {"mean": mean, "ci95": half, "per_round": paired}
        rows.append((label, f"{summary['alone'][key]:.3f} s", f"{summary['watched'][key]:.3f} s",
                     f"{100 * mean:+.1f}% ± {100 * half:.1f}", "<= +2%" if key.startswith("step") else "-"))
    table(rows, ("measure", "alone", f"with {args.watchers} top at 1 Hz", "change (95% CI, paired rounds)", "target"))
    write("top_cost", {"rounds": args.rounds, "steps": args.steps, "groups": args.groups, "watchers": args.watchers,
                       "runs": runs, "summary": summary, "changes": changes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
