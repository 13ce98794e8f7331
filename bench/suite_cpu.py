"""Where the test suite's CPU goes: each test's CPU-seconds, its own and those of every process
it started, wherever that process went.

    python bench/suite_cpu.py [--top 40] [-- PYTEST ARGS]     # default: the whole suite, as CI runs it

The suite is CPU-bound on 2 cores (three xdist workers keep both busy), so its wall time is
its CPU-seconds over two, and a test's wall time in `--durations` says little: a test that
waits on restarts is long and cheap, a fixed-length one (the soak) takes whatever it is given.
This runs pytest with a small plugin that writes, per worker, the test it is running, and
samples every process on the machine twice a second:

  * a process started by a test carries PYTEST_CURRENT_TEST in the environment it was
    started with (/proc/PID/environ): heads, nodes, trials, CLI commands and benches, and
    what each forked, daemons included;
  * a pytest process, and what it forked without an exec (an in-process head's actors), has
    only the environment pytest was started with; the plugin names each worker's process
    `suitecpu-gwN` (Linux's process name, which a fork keeps and an exec resets), so their
    CPU goes to the test that worker runs then.

What no test started (the kernel, this sampler, another user) is counted apart.  A process
that lives less than a sample misses its last half second; pytest's own processes wait for
one more sample as they exit, so a short test's CPU is not lost when the machine is so busy
that no sample fell inside it.  Prints the tests and the files that cost most, and writes
bench/results/suite_cpu.json.  Nothing is judged: this is where the next cut of the suite's
time is chosen (issue 51's 15 minutes).
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import parse, table, write  # noqa: E402

ROOT = HERE.parent
TICKS = os.sysconf("SC_CLK_TCK")
PREFIX = "suitecpu-"
PLUGIN = '''import ctypes, os
def _worker():
    return os.environ.get("PYTEST_XDIST_WORKER", "main")
# on import (before conftest imports torch): the process's name, kept by every fork (an
# in-process head's actors), reset by an exec
ctypes.CDLL(None).prctl(15, ("%s" + _worker()).encode()[:15], 0, 0, 0)     # PR_SET_NAME
def pytest_runtest_logstart(nodeid, location):
    folder = os.environ["SUITE_CPU_DIR"]
    with open(os.path.join(folder, _worker() + ".tmp"), "w") as f:
        f.write(nodeid)
    os.replace(os.path.join(folder, _worker() + ".tmp"), os.path.join(folder, _worker()))
def _samples():
    try:
        return int(open(os.path.join(os.environ["SUITE_CPU_DIR"], "samples")).read() or 0)
    except (OSError, ValueError):
        return 0
def pytest_unconfigure(config):
    # the CPU a process spent after the last sample is lost when it exits: wait for a sample
    # that began after now (the one under way may have read this process already), 5 s at most
    import time
    seen, deadline = _samples(), time.time() + 5
    while _samples() < seen + 2 and time.time() < deadline:
        time.sleep(0.02)
''' % PREFIX


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine has spent busy (/proc/stat: user, nice, system, irq, softirq)."""
    fields = open("/proc/stat").readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / TICKS


def started_by(pid: int) -> str | None:
    """The test in the environment ``pid`` was started with, if a test started it."""
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in raw:
        if item.startswith(b"PYTEST_CURRENT_TEST="):
            return item.split(b"=", 1)[1].decode(errors="replace").rsplit(" (", 1)[0]
    return None


class Sampler:
    """Every process's CPU, added to the test that owns it, every ``interval_s``."""

    def __init__(self, folder: Path, interval_s: float):
        self.folder, self.interval_s = folder, interval_s
        self.by_test: collections.Counter = collections.Counter()
        self.elsewhere: collections.Counter = collections.Counter()     # by process name
        self.seen: dict[tuple[int, str], list] = {}                      # (pid, start) → [test, cpu so far, name]
        self.stop = threading.Event()
        self.first = True
        self.samples = 0

    def running(self, worker: str) -> str:
        try:
            return (self.folder / worker).read_text()
        except OSError:
            return f"(worker {worker}, outside a test: start-up, collection)"

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            comm, rest = stat.split(" (", 1)[1].rsplit(") ", 1)
            fields = rest.split()
            cpu, key = (int(fields[11]) + int(fields[12])) / TICKS, (int(name), fields[19])
            entry = self.seen.get(key)
            if entry is None:
                # (what ran before the suite started is not the suite's)
                entry = self.seen[key] = [started_by(int(name)), cpu if self.first else 0.0, comm]
            elif entry[0] is None and comm != entry[2]:
                entry[0], entry[2] = started_by(int(name)), comm       # a fork that then ran exec
            spent, entry[1] = cpu - entry[1], cpu
            if spent <= 0:
                continue
            test = entry[0]
            if test is None and comm.startswith(PREFIX):
                test = self.running(comm[len(PREFIX):])
            if test is None:
                self.elsewhere[entry[2]] += spent
            else:
                self.by_test[test] += spent
        self.first = False
        self.samples += 1
        (self.folder / "samples.tmp").write_text(str(self.samples))     # a worker waits for it at its exit
        os.replace(self.folder / "samples.tmp", self.folder / "samples")

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval_s)
        self.sample()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=40, help="tests shown (default 40); the JSON has them all")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    ap.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default: the whole suite)")
    args = parse(ap, {"pytest_args": ["tests/test_gpus.py::test_a_machine_without_a_gpu_driver_counts_none_"
                                      "without_importing_torch", "-n0"], "top": 5,
                        "interval": 0.1})       # the test takes ~1 s: samples inside it
    if not 0.01 <= args.interval <= 60:          # (NaN fails this too)
        ap.error(f"--interval {args.interval}: seconds between samples, 0.01 to 60")
    if args.top < 1:
        ap.error(f"--top {args.top}: how many tests to show, at least 1")
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        folder = Path(tmp)
        (folder / "suite_cpu_plugin.py").write_text(PLUGIN)
        # (run from a test, the suite it runs is its own: not the outer test's processes)
        outer = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_CURRENT_TEST", "PYTEST_XDIST"))}
        env = {**outer, "SUITE_CPU_DIR": str(folder),
               "PYTHONPATH": os.pathsep.join([str(folder)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        sampler = Sampler(folder, args.interval)
        sampler.sample()                       # what already ran is not counted
        thread = threading.Thread(target=sampler.run, daemon=True)
        busy0, t0 = busy_cpu_s(), time.time()
        thread.start()
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", "-q",
                                   "-p", "no:cacheprovider", *args.pytest_args], cwd=ROOT, env=env)
        finally:
            sampler.stop.set()
            thread.join()
        wall, busy = time.time() - t0, busy_cpu_s() - busy0
    tests = sampler.by_test
    files = collections.Counter()
    for test, spent in tests.items():
        files[test.split("::")[0]] += spent
    attributed = sum(tests.values())
    table([(test, f"{spent:.1f}", f"{100 * spent / busy:.1f}%") for test, spent in tests.most_common(args.top)],
          ("test", "CPU-s", "of the machine's"))
    table([(f, f"{spent:.1f}", f"{100 * spent / busy:.1f}%") for f, spent in files.most_common(args.top)],
          ("file", "CPU-s", "of the machine's"))
    print(f"pytest exit {done.returncode}; {wall:.0f} s of wall time, {busy:.0f} busy CPU-s on "
          f"{os.cpu_count()} cores ({100 * busy / (wall * os.cpu_count()):.1f}%), {attributed:.0f} of them "
          f"({100 * attributed / busy:.0f}%) in the tests' processes")
    write("suite_cpu", {"pytest_args": args.pytest_args, "pytest_exit": done.returncode, "wall_s": wall,
                        "busy_cpu_s": busy, "cores": os.cpu_count(), "attributed_cpu_s": attributed,
                        "by_test": dict(tests.most_common()), "by_file": dict(files.most_common()),
                        "not_by_a_test": dict(sampler.elsewhere.most_common(20))})
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
