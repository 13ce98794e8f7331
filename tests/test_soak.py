"""The soak at the suite's scale: bench/soak.py's run (tests/soak.py) for a few minutes, a
fault every 40 s, with the same checks as the hour-long one: no process grows past the
warm-up, the run directory stays flat, the step rate holds, no false node loss, no group
lost or doubled."""
import pytest

from soak import Soak, verdicts

pytestmark = [pytest.mark.slow, pytest.mark.netns]

MINUTES, FAULT_EVERY_S, WARMUP_S, WINDOW_S = 4, 40, 60, 60


def test_a_few_minutes_of_faults_leave_memory_disk_and_step_rate_flat(swarm, network, tmp_path):
    soak = Soak(swarm, network, tmp_path)
    soak.start()
    soak.run_for(MINUTES * 60, FAULT_EVERY_S)
    result = soak.report(WARMUP_S, WINDOW_S)
    rows = verdicts(result)
    for measure, value, target, met in rows:
        print(f"{measure}: {value} (target {target})")
    assert {what for _, what in result["faults"]} == {"runner", "learner", "gateway", "netcut", "head"}
    assert all(met for *_, met in rows), [r for r in rows if not r[3]]
