"""The soak at the suite's scale: bench/soak.py's own run and report for 3.5 minutes, and the
hour-long run's growth checks at that scale: no process's memory grows past its warm-up, the
run directory stays flat, no false node loss, no group lost or doubled.  This test is also
what keeps that bench from rotting (it calls the bench's ``soak`` and ``publish``), so the
suite runs no separate smoke of it: the same swarm, hosts and faults twice cost ~100 CPU-s.

The five faults (each once, in a shuffled order, 20 s apart) fall between a quiet first minute
and a quiet last minute.  Its agents are paced (EPISODE_S), the hour-long bench's are not.  The step rate
of those minutes, per wall-clock second and per CPU-second the swarm spent, is printed, not
judged: the suite runs three tests at a time on two cores and the neighbours decide both (on
a fresh clone: +39% and +17% from the first minute to the last, with nothing wrong).  The
hour-long bench, run alone, judges the rate."""
import importlib.util
import json
import sys

import pytest

from swarm import REPO

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(600)]

# The hour's proportions: its 10-minute warm-up is a sixth of the run, 35 s of these 210.  The
# last fault (a head restart at worst, back in ~15 s) leaves the last window (165–210 s) quiet.
# (5 minutes until 2026-12-06: the same checks held, at 60% more of the suite's CPU.)
SECONDS, WARMUP_S, WINDOW_S = 210, 35, 45
FAULT_EVERY_S, FAULTS_FROM_S, FAULTS_UNTIL_S = 20, 65, 150    # faults at 65, 85, 105, 125, 145 s
WALL_CLOCK = "steps per minute"           # printed: the neighbours decide it here
# Each episode first waits a second, as an agent's tools would: the loop then runs at ~50 steps a
# minute and takes ~0.55 of a core (123 CPU-s alone) instead of every core it can get (378
# alone, ~206 in the suite at 164-205 steps a minute).  The hour-long bench runs unpaced.
EPISODE_S = 1.0


def load_bench_soak():
    """bench/soak.py as a module.  Its name is tests/soak.py's (which it imports), so it is
    loaded from its path; bench/ goes last on the path, for its ``common``, shadowing nothing."""
    bench = REPO / "bench"
    if str(bench) not in sys.path:
        sys.path.append(str(bench))
    spec = importlib.util.spec_from_file_location("bench_soak", bench / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.long(minutes=4)
def test_minutes_with_every_fault_leave_memory_and_disk_flat_and_lose_nothing(swarm, network, tmp_path, monkeypatch):
    bench = load_bench_soak()
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path / "results")
    result = bench.soak(swarm, network, tmp_path, SECONDS / 60, FAULT_EVERY_S, WARMUP_S, WINDOW_S, sample_s=3,
                        faults_from_s=FAULTS_FROM_S, faults_until_s=FAULTS_UNTIL_S, episode_s=EPISODE_S)
    rows = bench.publish(result, "soak-suite", unjudged=(WALL_CLOCK, "minutes"))
    for name, g in sorted(result["processes"].items(), key=lambda kv: -kv[1]["growth"])[:3]:
        print(f"  {name}: {g['rss_mb_at_warmup']:.0f} → {g['rss_mb_at_end']:.0f} MB, judged {g['judged_s']:.0f} s")
    assert sorted(what for _, what in result["faults"]) == sorted(["runner", "learner", "gateway", "netcut", "head"])
    assert all(FAULTS_FROM_S - 1 <= t < FAULTS_UNTIL_S + 20 for t, _ in result["faults"]), result["faults"]
    assert result["processes"], "no process lived long enough to be judged"
    assert result["steps_per_cpu_s_first"] > 0 and result["steps_per_cpu_s_last"] > 0, result
    failed = [row for row in rows if not row[3] and not row[0].startswith((WALL_CLOCK, "minutes"))]
    assert not failed and result["targets_met"], failed
    # what the bench writes: its results file (read back) and its plot
    assert json.loads((tmp_path / "results" / "soak-suite.json").read_text())["faults"] == [list(f) for f in result["faults"]]
    assert (tmp_path / "results" / "plots" / "soak-suite.png").stat().st_size > 0
