"""Keep the garbage collector off the heap a process was forked with.

Every actor process is a fork of a front process that imported torch, transformers and the
rest: ~430,000 objects the garbage collector tracks, none of which will ever be garbage.  A
full collection walks all of them: 170-260 ms of CPU each, once in each busy actor as it
started and then every ~6 s in a training gateway (every 20-40 s in the others).  Walking
them also writes to every object's header, so each process soon held its own copy of pages
it had shared with its parent.  ``gc.freeze()`` moves what exists now to a generation no
collection visits; what the process allocates afterwards is collected as before, and a full
collection then takes 1-10 ms.

Measured on the quickstart's job, a head with 2 runners after 45 s of training (16
processes, two runs each): private memory (USS) 799-826 MB → 307-344 MB, proportional
(PSS) 1,099-1,125 MB → 610-648 MB.  See docs/architecture.md, "Where a step's time goes".
"""
from __future__ import annotations

import gc


def freeze_inherited() -> None:
    """Call first thing in a forked process: everything inherited is left alone for good.

    Nothing is lost to this: what was garbage already is unreachable here; an inherited
    object that becomes garbage later is still freed when its last reference goes, as almost
    every object is; only a cycle of inherited objects dropped later would stay, and what a
    fork inherits (modules, classes, the front's configuration) lives as long as the process."""
    gc.freeze()
