"""Actor kinds a tree file may name, and how a kind becomes an actor class.

A kind is either a short name below or ``package.module:Class`` for a user's own actor
(it must be importable on the node that hosts it and subclass ManagedActor).
"""
from __future__ import annotations

import importlib

from actorjet.errors import UserError
from actorjet.runtime import heap

KINDS = {
    "supervisor": "actorjet.runtime.supervisor:Supervisor",
    "registry": "actorjet.actors.registry:Registry",
    "runner": "actorjet.actors.runner:AgentRunner",
    "engine": "actorjet.actors.engine:Engine",
    "gateway": "actorjet.actors.gateway:Gateway",
    "learner": "actorjet.actors.learner:Learner",
    "learner_rank": "actorjet.actors.learner_rank:LearnerRank",
    "probe": "actorjet.runtime.probe:Probe",
    "door": "actorjet.actors.door:Door",
}


def names() -> list[str]:
    return sorted(KINDS)


def resolve(kind: str) -> type:
    """Import and return the actor class for ``kind``; UserError if there is none."""
    if kind == "merger":
        raise UserError("actor kind 'merger' no longer exists: each learner pulls its batches from its "
                        "model's episode store. Remove the merger's [[children]] entry from the tree file.")
    target = KINDS.get(kind, kind)
    if ":" not in target:
        raise UserError(f"unknown actor kind {kind!r} (known: {', '.join(names())}, "
                        "or 'package.module:Class')")
    module_name, _, class_name = target.partition(":")
    try:
        with heap.collector_paused():       # the first kind to load imports torch (heap.py)
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"actor kind {kind!r}: cannot import {module_name}: {e}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UserError(f"actor kind {kind!r}: {module_name} has no class {class_name}")
    return cls


def preload(kind_names, job: dict | None = None) -> None:
    """Import these kinds' modules in the process that will fork the actor system, and run
    each module's ``preload(job)`` hook if it has one (imports it would otherwise make lazily).

    thespian forks every actor (admin → supervisors → children), so what the parent imported
    the children share: a head that preloads its engine, learner and gateway imports torch
    and transformers once (~6 s of CPU on 2 cores) instead of once per actor and once more per
    restart, and a crashed engine is serving again sooner.  A kind that cannot be imported
    here is left for its actor to report (tree loading has already checked the tree's kinds)."""
    with heap.collector_paused():
        for kind in sorted(set(kind_names)):
            module_name = KINDS.get(kind, kind).partition(":")[0]
            try:
                hook = getattr(importlib.import_module(module_name), "preload", None)
                if callable(hook):
                    hook(job or {})
            except Exception:      # noqa: BLE001 - reported where the actor starts, with its path
                pass
