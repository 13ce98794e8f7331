import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import actorjet  # noqa: E402,F401  - sets thespian's convention timings before thespian loads

from swarm import Swarm  # noqa: E402

TREES = Path(__file__).resolve().parent / "trees"


@pytest.fixture
def swarm(tmp_path):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def trees():
    return TREES
