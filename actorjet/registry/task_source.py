"""A task source: a stream of tasks and the versioned behavior that runs them.

The registry keeps one per task of the job (and per task added live with `actorjet task
add`); leases draw tasks from it, and runners get the behavior's signed payload.
"""
from __future__ import annotations

import importlib

from actorjet import behaviors
from actorjet.config import examples_name
from actorjet.registry.behavior_store import BehaviorStore


def load_function(ref: str):
    module_name, _, name = examples_name(ref).partition(":")
    module = importlib.import_module(module_name)
    return module, getattr(module, name)


class TaskSource:
    """A task stream and its behavior.  The behavior is named after the task, and its live
    version comes from the store: after a restart the upgraded code keeps running, unless
    the job config now names a different function (then that becomes a new version)."""

    def __init__(self, cfg: dict, seed: int, secret: str, store: BehaviorStore):
        self.name, self.cfg, self.secret = cfg["name"], cfg, secret
        self.behavior = self.name
        self.weight, self.state, self.issued = float(cfg.get("weight", 1.0)), "active", 0
        self.tasks = importlib.import_module(examples_name(cfg["source"])).tasks(seed)
        current = store.current(self.name)
        if current is None or store.index(self.name).get("config") != cfg["behavior"]:
            module, fn = load_function(cfg["behavior"])
            current = store.add(self.name, behaviors.pickle_function(module, fn), cfg["behavior"])
            store.set_config(self.name, cfg["behavior"])
            store.activate(self.name, current)
        self.set_version(current, store.blob(self.name, current))

    def set_version(self, version: int, blob: bytes) -> None:
        self.version = version
        self.payload = behaviors.sign(self.secret, self.name, version, blob)

    def payload_for(self, version: int, store: BehaviorStore) -> dict:
        """A retried group keeps the version it started with, even after an upgrade."""
        if version == self.version:
            return self.payload
        return behaviors.sign(self.secret, self.name, version, store.blob(self.name, version))
