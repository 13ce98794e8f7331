"""Benches at their smoke size, so none can rot unseen: each runs as a user runs it and its
JSON is read back."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def smoke(tmp_path: Path, script: str, *args: str, timeout_s: float = 300) -> dict:
    env = {**os.environ, "ACTORJET_BENCH_RESULTS": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [written] = list(tmp_path.glob("*.json"))
    return json.loads(written.read_text())


@pytest.mark.slow
def test_kept_caches_bench_decodes_kept_conversations_in_one_batch(tmp_path):
    """bench/kept_caches.py: with kept caches a turn takes as many forward passes as without
    (one batch for all conversations; one conversation at a time took 8x more here)."""
    out = smoke(tmp_path, "kept_caches.py")
    assert out["keys"]["forwards_per_turn"] == out["none"]["forwards_per_turn"]
    assert out["keys"]["hits"] > 0 and out["keys_over_none"] > 0
