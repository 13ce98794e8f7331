"""How ActorJet's processes use Python's garbage collector: an actor leaves the heap it was
forked with alone, the gateway collects young objects less often, and a head does not collect
while it imports its actor modules (``collector_paused``).

**The inherited heap.**  Every actor process is a fork of a front process that imported
torch, transformers and the rest: ~430,000 objects the garbage collector tracks, none of
which will ever be garbage.  A full collection walks all of them: 170-260 ms of CPU each,
once in each busy actor as it started and then every ~6 s in a training gateway (every
20-40 s in the others).  Walking them also writes to every object's header, so each process
soon held its own copy of pages it had shared with its parent.  ``gc.freeze()`` moves what
exists now to a generation no collection visits; a full collection then takes 1-10 ms.
Measured on the quickstart's job, a head with 2 runners after 45 s of training (16
processes, two runs each): private memory (USS) 799-826 MB → 307-344 MB, proportional (PSS)
1,099-1,125 MB → 610-648 MB.

**Young collections.**  Python collects its youngest generation each time 700 more objects
were allocated than freed.  A gateway keeps thousands alive per request in flight (parsed
bodies, token id lists, futures), so each collection walked them again: 1,226 young and 111
middle collections took 670 ms of the gateway's 14.1 CPU-s over 100 steps of
`bench/overhead.py --agents plain` (5%; the engine 1.3%, the others less).  At 20,000 there
were 0-2 collections in any process in the same run: nearly every object here is freed by
its reference count, and garbage in reference cycles still triggers a collection once 20,000
of it has built up (a few MB at most).  Only the gateway does this: it holds no tensors,
while a cycle in a learner or an engine could keep a large one alive until a collection.
See docs/architecture.md, "Where a step's time goes".
"""
from __future__ import annotations

import contextlib
import gc

YOUNG_THRESHOLD = 20_000     # objects allocated, net, between two young collections (Python: 700)


def freeze_inherited() -> None:
    """Call first thing in a forked process: what it inherited is left alone for good.

    Nothing is lost to this: what was garbage already is unreachable here; an inherited
    object that becomes garbage later is still freed when its last reference goes, as almost
    every object is; only a cycle of inherited objects dropped later would stay, and what a
    fork inherits (modules, classes, the front's configuration) lives as long as the process."""
    gc.freeze()


def collect_young_less_often() -> None:
    """For a process that answers many small requests and holds no large buffers."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def state() -> dict:
    """What a Pong tells of this process's collector (tests check both settings live)."""
    return {"frozen": gc.get_freeze_count(), "young_threshold": gc.get_threshold()[0]}


@contextlib.contextmanager
def collector_paused():
    """No collection while importing the actor modules (torch, transformers, openai).

    Imports allocate ~430,000 objects that live as long as the process, and the collector,
    seeing the heap grow, walked it again and again: 0.6 of the 4.7 CPU-s that importing a
    head's actor modules and a Llama model class took (three runs each way; 6 full
    collections).  Paused while kinds are loaded and preloaded (runtime/kinds.py), a head on
    the quickstart's job reached its first step after 7.39-7.69 CPU-s in all against
    7.79-8.05, its front 4.66-4.79 against 5.02-5.12 (three runs each way)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
