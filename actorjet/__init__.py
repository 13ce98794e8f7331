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


def _our_agents_first() -> None:
    """Make ``agents`` this repository's example package wherever Python was started from.

    The OpenAI Agents SDK is a package named ``agents`` too (agents/__init__.py says how both
    live side by side).  Started as a console script (``actorjet start``), Python finds the
    SDK's first, so importing a task source such as ``agents.arithmetic`` ran the SDK's
    ``__init__`` (pydantic models, MCP: 1.8 s of CPU in every head and trial, and its memory in
    every actor forked from it).  Ours first, the SDK still loads when a behavior asks for one
    of its names (``from agents import Agent``), through our package's ``__getattr__``."""
    import importlib.util
    import sys

    init = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agents", "__init__.py")
    if "agents" in sys.modules or not os.path.isfile(init):
        return
    spec = importlib.util.spec_from_file_location("agents", init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["agents"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:       # noqa: BLE001 - never stop actorjet's import over the examples
        del sys.modules["agents"]


_our_agents_first()


def connect(head: str, **kwargs):
    """Client mode: ``with actorjet.connect("127.0.0.1:8400").episode(...) as ep:``."""
    from actorjet.runner.client import Client

    return Client(head, **kwargs)
