"""Shared by the benchmarks: an embedded head with real actors, and result tables."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import actorjet  # noqa: F401  - sets thespian's timings first
from actorjet.config import normalize, tree_path
from actorjet.models.prepare import prepare
from actorjet.runtime.head import Head
from actorjet.runtime.tree_spec import load_tree
from actorjet.runtime.system import free_port

# the suite's smoke runs write elsewhere (tests/test_benches.py): the committed results stay
RESULTS = Path(os.environ.get("ACTORJET_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
SMOKE = False        # set by parse(): a smoke run's results file is named NAME-smoke


def parse(ap: argparse.ArgumentParser, smoke: dict) -> argparse.Namespace:
    """Every bench's ``--smoke``: the same code at sizes that run in seconds, so a bench that
    breaks fails the suite (tests/test_benches.py runs them all, slow tier) instead of rotting
    until someone needs its figure.  ``smoke`` maps option names (as argparse stores them) to
    the sizes it runs at; its results go to NAME-smoke.json, never over a measured file (an
    explicit ``--label`` names the file as given: bench/gpu_check.sh --dry-run)."""
    global SMOKE
    # a SIGTERM (a timeout, a user's kill) unwinds like Ctrl-C: the bench's finally blocks
    # stop what it started (tests/swarm.py's children also die with it)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in smoke.items())
    ap.add_argument("--smoke", action="store_true",
                    help=f"run in seconds ({sizes}): the suite's check that this bench still works")
    args = ap.parse_args()
    if args.smoke:
        labelled = getattr(args, "label", None) not in (None, ap.get_default("label"))
        for name, value in smoke.items():
            setattr(args, name, value)
        SMOKE = not labelled
    return args


def result_name(name: str) -> str:
    """The name a results file (or plot) of this run gets: NAME-smoke for a smoke run."""
    return f"{name}-smoke" if SMOKE else name


def start_head(run_dir: Path, job_spec: dict, slots: int = 0, tree: str = "default.toml") -> Head:
    job = prepare(normalize(job_spec, "bench"))
    head = Head(run_dir, load_tree(tree_path(tree)), job, port=free_port(), slots=slots)
    head.start()
    return head


def wait_for_service(head: Head, model: str, kind: str, timeout_s: float = 60.0) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        url = head.status().get("services", {}).get(model, {}).get(kind)
        if url:
            return url
        time.sleep(0.2)
    raise RuntimeError(f"{model}/{kind} did not come up")


def cpu_seconds(pids: dict) -> dict:
    """CPU seconds (user + system) so far of each process of ``{key: pid}``, as ``{key: s}``.
    A process that ended is left out: what it used ended with it."""
    import psutil

    out = {}
    for key, pid in pids.items():
        try:
            out[key] = sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.Error:
            pass
    return out


def table(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def interval(values: list, fmt: str = ".3g", centre: str = "mean") -> str:
    """A figure over seeds as "centre [low, high]": the 95% t interval of the mean
    (actorjet/research/stats.py); ``centre`` is the mean or the median; None values (a target
    never reached) are left out, and none at all is "never"."""
    import statistics

    from actorjet.research.stats import mean_ci

    values = [v for v in values if v is not None]
    if not values:
        return "never"
    mid = statistics.median(values) if centre == "median" else statistics.fmean(values)
    if len(values) < 2:
        return f"{mid:{fmt}}"
    _, low, high = mean_ci(values)
    return f"{mid:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def half_width(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% t interval): NaN for a single value."""
    from actorjet.research.stats import mean_ci

    mean, low, high = mean_ci(values)
    return mean, (high - low) / 2


def write(name: str, data: dict) -> Path:
    name = result_name(name)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    print(f"wrote {path}")
    return path
