"""Base class for every actor that lives in a supervisor tree.

It gives OTP's "let it crash" semantics on top of thespian: thespian would retry a
failing message once and keep the actor alive with possibly broken state; a managed
actor instead reports the error to its supervisor and exits, so the supervisor restarts
it from its spec's state.
"""
from __future__ import annotations

import os
import traceback

from thespian.actors import ActorExitRequest, ActorTypeDispatcher

from actorjet.runtime import endpoints, logs
from actorjet.runtime import heap
from actorjet.runtime.lineage import die_with_parent, exit_soon_after_sigterm
from actorjet.runtime import messages as m
from actorjet.runtime.node import on_node

log = logs.log


def where_i_run(path: str) -> m.ActorUp:
    return m.ActorUp(path, os.getpid(), os.environ.get(endpoints.NODE_NAME_ENV, "?"), endpoints.advertise_host())


class ManagedActor(ActorTypeDispatcher):
    child_id: str = "?"
    path: str = "?"
    args: dict = {}
    context: dict = {}
    supervisor = None
    incarnation = 0              # which start of this child (Init): its announcements carry it
    crashed = False              # set when a message handler raised: the exit that follows is a crash
    signalled = False            # set on SIGTERM: the process ends SIGTERM_EXIT_S later (lineage.py)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        die_with_parent()             # runs in the actor's own process, right after the fork
        heap.freeze_inherited()       # the front's imports are never garbage: no collection walks them
        exit_soon_after_sigterm(self._on_sigterm)
        self.initialized = False
        self._early: list = []        # our messages that came before Init, handled after it

    @property
    def stop_grace_s(self) -> float:
        """How long ``on_stop`` may wait for in-flight work (an HTTP server's requests).  After a
        crash nothing it holds will be answered (a stalled batcher, a blocked loop) and its
        restart waits for this process to free its port: 1 s, not the 10 s of an orderly stop.
        After a SIGTERM the process has SIGTERM_EXIT_S in all: 1 s too."""
        return 1.0 if self.crashed or self.signalled else 10.0

    def _on_sigterm(self) -> None:
        self.signalled = True

    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        """A child placed on a node (``{"node_id": ...}``, see supervisor.py) starts there only."""
        return on_node(capabilities, requirements)

    def receiveMessage(self, msg, sender):
        logs.ensure()
        if not self.initialized and not isinstance(msg, m.Init) and type(msg).__module__.startswith("actorjet."):
            # Init comes from the supervisor; others who know the address (a status query, a
            # subscriber) may be faster, and this actor has no state to answer them with yet.
            self._early.append((msg, sender))
            return
        try:
            super().receiveMessage(msg, sender)
        except Exception as e:  # noqa: BLE001 - any failure means: restart me cleanly
            detail = f"{type(e).__name__}: {e}"
            self.crashed = True
            log.error("%s crashed on %s: %s\n%s", self.path, type(msg).__name__, detail,
                      traceback.format_exc())
            if self.supervisor is not None:
                self.send(self.supervisor, m.ChildCrashed(self.child_id, detail))
            self.send(self.myAddress, ActorExitRequest())

    # -- messages every managed actor understands ----------------------------------------
    def receiveMsg_Init(self, msg: m.Init, sender):
        self.child_id, self.path, self.args = msg.child_id, msg.path, dict(msg.args)
        self.context, self.supervisor = dict(msg.context), msg.supervisor
        self.incarnation = msg.incarnation
        self.on_init()
        if self.registry is not None:
            self.send(self.registry, where_i_run(self.path))
        self.initialized = True
        early, self._early = self._early, []
        for early_msg, early_sender in early:
            self.receiveMessage(early_msg, early_sender)

    def receiveMsg_ContextUpdate(self, msg: m.ContextUpdate, sender):
        self.context.update(msg.context)
        self._send_announcements()       # a new (restarted) registry knows nothing of them yet
        self.on_context()

    def announce(self, model: str, services: dict[str, str | None], subscribe: bool = False) -> None:
        """Tell the registry where this actor serves (``{"engine": url, ...}``; None: no URL,
        the actor's address is what counts) and, with ``subscribe``, ask for the directory of
        every model's services.  Repeated by itself whenever the registry changes."""
        self._announcements = (model, dict(services), subscribe)
        self._send_announcements()

    def _send_announcements(self) -> None:
        model, services, subscribe = getattr(self, "_announcements", ("", {}, False))
        if self.registry is None:
            return
        for kind, url in services.items():
            self.send(self.registry, m.ServiceUp(model, kind, url, self.myAddress, self.supervisor, self.child_id,
                                                 os.getpid(), self.incarnation))
        if subscribe:
            self.send(self.registry, m.Subscribe("directory"))

    def receiveMsg_Ping(self, msg: m.Ping, sender):
        self.send(sender, m.Pong(msg.nonce, os.getpid(), {**self.info(), "gc": heap.state()}))

    def receiveMsg_Crash(self, msg: m.Crash, sender):
        raise RuntimeError(msg.error)

    def receiveMsg_ActorExitRequest(self, msg, sender):
        self.on_stop()

    def receiveUnrecognizedMessage(self, msg, sender):
        log.debug("%s ignores %r", self.path, type(msg).__name__)

    def stop_normally(self) -> None:
        """End this actor as finished, not failed: a ``transient`` child is then not restarted.
        The supervisor marks the exit as normal and then asks the child to exit, so the mark is
        in place before the exit notice arrives (no race between two messages)."""
        if self.supervisor is not None:
            self.send(self.supervisor, m.StoppingNormally(self.child_id))
        else:
            self.send(self.myAddress, ActorExitRequest())

    # -- hooks for subclasses -------------------------------------------------------------
    def on_init(self) -> None:
        """Called after (every) start with ``self.args`` and ``self.context`` set."""

    def on_context(self) -> None:
        """Called when a shared address in ``self.context`` changed."""

    def on_stop(self) -> None:
        """Called when the actor is asked to exit: release ports, threads, files."""

    def info(self) -> dict:
        """Extra data for Pong replies (tests and status)."""
        return {"path": self.path, "args": self.args}

    @property
    def registry(self):
        return self.context.get("registry")
