"""Long-lived threads inside actors: one that dies takes its actor with it.

An actor's process can outlive a thread it depends on (the engine's batcher, an HTTP
server loop): the process still answers pings, so no supervisor notices, and the swarm
hangs without a word.  Every long-lived thread is started here instead.  If its target
raises, the traceback is logged (``thread <name> of pid N died``) and the process exits at
once with status 70; thespian reports the exit to the supervisor, which restarts the actor
by its spec — loud failure, handled, OTP style.

Outside an actor process (tests, the learner's in-process evaluation engine) pass
``crash_process=False``: the failure is logged and the thread simply ends.
"""
from __future__ import annotations

import os
import threading
import traceback
from typing import Callable

from actorjet.runtime.logs import log

EXIT_STATUS = 70      # EX_SOFTWARE


def start(target: Callable[[], None], name: str, crash_process: bool = True) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException:  # noqa: BLE001 - whatever kills the thread must be loud
            log.critical("thread %s of pid %d died; %s\n%s", name, os.getpid(),
                         "the actor exits so that its supervisor restarts it" if crash_process else "",
                         traceback.format_exc())
            for handler in log.handlers:
                handler.flush()
            if crash_process:
                os._exit(EXIT_STATUS)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
