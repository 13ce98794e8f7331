"""Benches at their smoke size, so none can rot unseen: each runs as a user runs it and its
JSON is read back.  bench/gpu_check.sh --dry-run runs kept_caches, scale, long_sample, vs_trl
and rl_throughput at tiny sizes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.long(minutes=2)
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
