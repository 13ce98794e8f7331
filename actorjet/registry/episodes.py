"""Episode bookkeeping inside the registry (leases, groups, results).

Filled in by the training path; for the runtime alone the desk only reports counters.
"""
from __future__ import annotations


class EpisodeDesk:
    def __init__(self, registry, context: dict):
        self.registry = registry
        self.counts = {"completed": 0, "aborted": 0, "in_flight": 0, "trained": 0}

    def handle(self, msg, sender) -> bool:
        return False

    def node_lost(self, node_id: str) -> None:
        pass

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass

    def status(self) -> dict:
        return {"episodes": dict(self.counts), "models": [], "behaviors": []}
