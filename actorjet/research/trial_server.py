"""A study's trials, forked from one process that has already imported what a trial needs.

Each trial is a head of its own (research/trial.py).  Started as ``python -m
actorjet.research.trial``, every trial paid for importing torch, transformers and its head's
actor kinds before its first step: ~4 CPU-s and ~4.5 s of wall time a trial on this 2-core
machine, ~80% of a 4-step trial (a smoke study's trial took 4.7-5.1 CPU-s in all, ~1 CPU-s
forked from here).  A study's controller (launchers.py ``LocalTrials``) and a swarm node's
TrialHost (runner/trial_runs.py) start this server through runtime/forks.py (the protocol,
and why not multiprocessing's forkserver, are there) and ask it for each trial:

    python -m actorjet.research.trial_server FOLDER/ [--term-with-parent]
"""
from __future__ import annotations

import sys

from actorjet.research import trial
from actorjet.runtime import forks

if __name__ == "__main__":
    sys.exit(forks.serve(sys.argv[1:], trial.preload, trial.main))
