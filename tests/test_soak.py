"""The soak at the suite's scale: bench/soak.py's run (tests/soak.py) for 70 s with a fault
every 12 s (each of the five once), and the hour-long run's growth checks at that scale: no
process's memory grows past its warm-up, the run directory stays flat, no false node loss,
no group lost or doubled.  (The step rate is left to the hour: in windows of 20 s one head
restart decides it.)"""
import pytest

from soak import Soak, verdicts

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.alone]   # it measures the machine

SECONDS, FAULT_EVERY_S, WARMUP_S, WINDOW_S = 70, 12, 20, 20


def test_a_fault_every_12_s_leaves_memory_and_disk_flat_and_loses_nothing(swarm, network, tmp_path):
    soak = Soak(swarm, network, tmp_path)
    soak.start()
    soak.run_for(SECONDS, FAULT_EVERY_S, sample_s=3)
    result = soak.report(WARMUP_S, WINDOW_S)
    rows = verdicts(result)
    for measure, value, target, met in rows:
        print(f"{measure}: {value} (target {target})")
    assert sorted(what for _, what in result["faults"]) == sorted(["runner", "learner", "gateway", "netcut", "head"])
    assert result["processes"], "no process lived long enough to be judged"
    failed = [row for row in rows if not row[3] and not row[0].startswith(("steps per minute", "minutes"))]
    assert not failed, failed
