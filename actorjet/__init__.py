"""ActorJet: reinforcement learning of LLM agents as a fault-tolerant actor swarm.

Importing the package sets thespian's convention timings *before* thespian itself is
imported anywhere, because thespian reads them once at import time and every node must
use the same values (see docs/architecture.md, "Membership").
"""
import os

# thespian's defaults notice a dead node after ~22 minutes; these make the convention
# re-register every 3 s.  Override them identically on every node, never on one only.
os.environ.setdefault("CONVENTION_REREGISTRATION_PERIOD", "0:03")
os.environ.setdefault("CONVENTION_RESTART_PERIOD", "0:03")
os.environ.setdefault("CONVENTION_REGISTRATION_MISS_MAX", "2")

# Actors load models in background processes: no download bars or advisory chatter there.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")      # models come from local directories only
# Counting GPUs in the head must not initialize CUDA: actors are forked from it.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

__version__ = "0.1.0"


def connect(head: str, **kwargs):
    """Client mode: ``with actorjet.connect("127.0.0.1:8400").episode(...) as ep:``."""
    from actorjet.runner.client import Client

    return Client(head, **kwargs)
