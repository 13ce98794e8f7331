"""A front process leaves without the interpreter's teardown.

With torch and transformers imported, Python's own exit (weakref finalizers, torch's
``_del_library`` for each operator library it registered, then module teardown) costs
~0.55 CPU-s and 0.5 s on an idle 2-core machine, and several seconds on a loaded one: under
a busy suite a head's front that had stopped its whole system in 0.7 s was still there 4–8 s
after its SIGTERM, against the 5 s every process is allowed.  By the time a front returns
from its command, what it owns is done (its head stopped, its files written and closed), so
it flushes what it printed and leaves.  A bug's exception still takes the normal exit, with
its traceback.  Actor processes already end this way (multiprocessing's ``os._exit``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Callable, NoReturn


def run_then_leave(main: Callable[..., int | None], *args) -> NoReturn:
    """``sys.exit(main(*args))``, minus the teardown."""
    try:
        code = main(*args)
    except SystemExit as e:      # argparse's --help, a SIGTERM handler's sys.exit
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    leave(code)


def leave(code: int) -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):      # a closed pipe (``| head``) has nothing to flush
            stream.flush()
    os._exit(code)
