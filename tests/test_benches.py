"""Every bench at its smoke size, so none can rot unseen (issue 51): each runs as a user runs
it (`python bench/NAME.py --smoke`), its JSON is read back and one figure of it checked, and
no process it started is left behind.  bench/gpu_check.sh --dry-run runs kept_caches, scale,
long_sample, vs_trl and rl_throughput at tiny sizes; a bench whose run a test already makes at
its own scale is kept working by that test (RUN_BY_TESTS); the others run here one by one."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import hosts

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
HELPERS = {"common", "digits_task", "plain_http_agents"}      # imported by benches, not run
GPU_CHECK = set(re.findall(r"bench/(\w+)\.py", (BENCH / "gpu_check.sh").read_text()))
NEEDS_HOSTS = {"chaos", "upgrade"}                            # every node on its own network namespace
# bench → the test that runs its code (not a copy of it) at the suite's scale: a smoke run here too
# would pay for the same swarm twice
RUN_BY_TESTS = {"soak": "tests/test_soak.py"}


def _values(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _values(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _values(v)
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield tree


# name → (the results file it writes, a check of what it measured)
SMOKES = {
    "algorithms": ("algorithms-smoke", lambda d: len(d["runs"]) == 1 and "error" not in d["runs"][0]),
    "chaos": ("chaos-smoke", lambda d: d["faults_injected"] == d["faults_survived"] == 9 and d["episodes_lost"] == 0
              and d["duplicate_episodes"] == 0 and d["leftover_processes"] == 0),
    "cocktail": ("cocktail-smoke", lambda d: d["alone"]["healthy"]["episodes_per_s"] > 0
                 and sum(d["cocktail"]["healthy"]["aborted_by_cause"].values()) == 0),
    "context": ("context-smoke", lambda d: all(w["tree"]["tokens"] <= w["prefix"]["tokens"] <= w["none"]["tokens"]
                                               and w["tree"]["tokens"] < w["none"]["tokens"]
                                               for w in d["results"]["tiny-arith"].values())),
    "control_plane": ("control_plane-both-smoke", lambda d: {r.get("kind") for r in d["results"]} == {"outbound", "thespian"}
                      and all(r["episodes_per_s"] > 0 for r in d["results"])),
    "exactness": ("exactness-smoke", lambda d: max(d["max_abs_logprob_diff"]["exact"].values()) <= 1e-5),
    "gateway": ("gateway-smoke", lambda d: all(r > 0 for r in d["completions_per_s"].values())),
    "idle": ("idle-smoke", lambda d: d["leftover_processes"] == 0 and "learner" in d["percent_of_a_core"]
             and d["total_percent_of_a_core"] > 0),
    "kill_loop": ("kill_loop-smoke", lambda d: all(t["reached_final_step"] == t["runs"] == 1 for t in d["totals"].values())),
    "long_episodes": ("long_episodes-after-smoke", lambda d: d["sizes"][0]["final_prompt_tokens"] > 256),
    "overhead": ("overhead-smoke", lambda d: d["baseline_s_per_step"] > 0
                 and all(s["s_per_step"] > 0 for s in d["swarm"].values())),
    "realmodel": ("realmodel-smoke", lambda d: d["runs"][0]["steps"] >= 2 and d["runs"][0]["wall_s_per_step"] > 0
                  and d["runs"][0]["before"] is not None),
    "research": ("research-smoke", lambda d: d["trials"] > 0 and d["duplicated_trials"] == 0),
    "retention": ("retention-smoke", lambda d: d["nothing_lost"] is True),
    "rollout_costs": ("rollout_costs-smoke", lambda d: all(v > 0 for v in _values(d["cpu_ms"]))),
    "runtime": ("runtime-smoke", lambda d: d["orphans_after_head_restart_and_cleanup"] == 0
                and d["restart_latency_ms"]["n"] == 3),
    "spread": ("spread_quickstart-smoke", lambda d: d["runs"][0]["ok"] and d["runs"][0]["last"] is not None),
    "suite_cpu": ("suite_cpu-smoke", lambda d: d["pytest_exit"] == 0 and d["attributed_cpu_s"] > 0
                  and d["by_test"].get("tests/test_gpus.py::test_a_machine_without_a_gpu_driver_counts_none_without_"
                                       "importing_torch", 0) > 0),
    "store": ("store-smoke", lambda d: d["episodes_per_s_one_core"] > 0),
    "top_cost": ("top_cost-smoke", lambda d: all(s["cpu_s_per_step"] > 0 for s in d["summary"].values())),
    "upgrade": ("upgrade-smoke", lambda d: d["upgrades"] == 2 and d["episodes_failed_by_swap"] == 0
                and d["leftover_processes"] == 0),
    "weightsync": ("weightsync-smoke", lambda d: all(r["total_s"] > 0 for r in d["rows"])),
}


def benches() -> set[str]:
    return {p.stem for p in BENCH.glob("*.py")} - HELPERS


def test_every_bench_has_a_smoke_size_that_the_suite_runs():
    """A new bench without ``--smoke``, or one the suite does not run, fails here (fast tier)."""
    for name in benches():
        source = (BENCH / f"{name}.py").read_text()
        assert re.search(r"\bparse\((ap|p|parser), \{", source), f"bench/{name}.py: parse its options with " \
                                                                   f"common.parse(ap, {{smoke sizes}})"
    assert benches() == set(SMOKES) | GPU_CHECK | set(RUN_BY_TESTS), (
        "a bench neither here, nor in bench/gpu_check.sh, nor run by a test", benches() ^ (set(SMOKES) | GPU_CHECK | set(RUN_BY_TESTS)))
    assert not set(SMOKES) & GPU_CHECK and not set(RUN_BY_TESTS) & (set(SMOKES) | GPU_CHECK), \
        "run once: here, in the GPU check's dry run, or by a test"
    for name, test in RUN_BY_TESTS.items():
        assert f"bench/{name}.py" in (ROOT / test).read_text(), f"{test} no longer runs bench/{name}.py"


BENCH_LIMIT_S = 240        # a smoke's limit: under the suite's 300 s a test (setup.cfg), with room to clean up


def _log_tails(work: Path, lines: int = 15) -> str:
    """The last lines of every log a killed bench left under its TMPDIR (its heads' and nodes')."""
    parts = []
    for log in sorted(work.rglob("*.log")):
        with contextlib.suppress(OSError):
            parts.append(f"--- {log.relative_to(work)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(parts)


def _started_by(tmp: Path) -> list[psutil.Process]:
    """Processes whose TMPDIR is this run's: the bench's own children, wherever they went."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("TMPDIR") == str(tmp):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKES))
def test_the_bench_runs_at_its_smoke_size(name, tmp_path):
    if name in NEEDS_HOSTS and hosts.unavailable():
        pytest.skip(f"bench/{name}.py runs every node on its own host: {hosts.unavailable()}")
    results, work = tmp_path / "results", tmp_path / "tmp"
    work.mkdir()
    env = {**os.environ, "ACTORJET_BENCH_RESULTS": str(results), "TMPDIR": str(work), "PYTHONUNBUFFERED": "1"}
    bench = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--smoke"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = bench.communicate(timeout=BENCH_LIMIT_S)
    except subprocess.TimeoutExpired:     # before pytest's own limit, so that it says where it hung
        bench.send_signal(signal.SIGINT)  # its own cleanup runs (swarm, network namespaces), then it is killed
        try:
            out, err = bench.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            bench.kill()
            out, err = bench.communicate()
        head = out[:2500] + ("\n[...]\n" if len(out) > 8500 else "")     # its progress, then where it ended
        pytest.fail(f"bench/{name}.py --smoke ran past {BENCH_LIMIT_S} s; its output:\n{head}{out[2500:][-6000:]}\n"
                    f"{err[-3000:]}\n{_log_tails(work)}")
    finally:
        deadline = time.time() + 10
        while _started_by(work) and time.time() < deadline:
            time.sleep(0.5)
        left = _started_by(work)
        for p in left:
            p.kill()
    assert bench.returncode == 0, out[-8000:] + err[-3000:]     # (a failed kill run prints its evidence)
    assert not left, f"bench/{name}.py left {[' '.join(p.cmdline()[:4]) for p in left]}"
    file, check = SMOKES[name]
    data = json.loads((results / f"{file}.json").read_text())
    assert check(data), f"{json.dumps(data)[:3000]}\n{out[-3000:]}"


@pytest.mark.slow
@pytest.mark.long(minutes=2)
@pytest.mark.timeout(900)     # ~160 CPU-s: past the default 300 s of wall when it shares two slow cores
def test_the_gpu_check_runs_every_step_on_the_cpu_at_tiny_shapes(tmp_path):
    """bench/gpu_check.sh --dry-run: every step the GPU machine will run, here at tiny shapes,
    so the script is known to work before device time is spent on it (issue 49).  Its
    results are read back: vs_trl's fixed bench (issue 50) keeps every snapshot and starts
    its clock at the first lease; kept caches decode in one batch; RL throughput runs both
    frameworks."""
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "TMPDIR": str(tmp_path), "GPU_CHECK_SKIP_TESTS": "1",
                                                       # its python3 is this interpreter (a venv not activated)
                                                       "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0 and "every GPU check ran" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    [out] = [p for p in tmp_path.glob("gpu-check-*") if p.is_dir()]
    read = lambda name: json.loads((out / f"{name}.json").read_text())  # noqa: E731
    assert read("gpu-long-episode")["last_over_first_turn"] > 0
    decode = read("gpu-decode")        # kept caches: as many forward passes a turn as without (one batch)
    assert decode["keys"]["forwards_per_turn"] == decode["none"]["forwards_per_turn"] and decode["keys"]["hits"] > 0
    assert read("gpu-ranks")["learner_ranks"]["two_ranks_s"] > 0
    assert read("gpu-long-sample-lora")["tokens_per_s"] > 0 and read("gpu-long-sample-full")["tokens_per_s"] > 0
    vs = read("gpu-vs-trl")
    aj = next(r for r in vs["runs"] if r["framework"] == "actorjet")
    assert [p["step"] for p in aj["curve"]] == list(range(0, vs["steps"] + 1, 2))     # every snapshot kept
    clocks = [p["clock_s"] for p in aj["curve"]]
    assert clocks[0] == 0 and all(0 < a < b for a, b in zip(clocks[1:], clocks[2:]))
    rl = read("gpu-rl-throughput")
    assert rl["actorjet"]["samples_per_s"] > 0 and rl["trl"]["samples_per_s"] > 0
