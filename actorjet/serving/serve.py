"""Run an aiohttp application in a background thread with its own event loop.

Actors are driven by thespian's loop, so their HTTP servers (gateway, engine) live in a
thread beside it; ``stop()`` closes the listening socket so a restart can bind again.

A server with a ``name`` is one of this node's services: it binds to the node's bind
address, its URL carries the node's advertised address, and it comes back on the port it
had before a restart (actorjet/runtime/endpoints.py).
"""
from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web

from actorjet.runtime import endpoints, guarded
from actorjet.runtime.logs import log

BEAT_S = 0.25


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (Linux, macOS: a dependency there), asyncio's
    elsewhere.  Measured on the quickstart's short calls: the gateway's CPU per call falls from
    ~0.70 to ~0.53 ms (bench/long_episodes.py), most of it epoll and callback bookkeeping."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class AppServer:
    def __init__(self, app: web.Application, name: str = "", host: str | None = None, port: int = 0,
                 crash_on_thread_death: bool | None = None, tls: bool = False):
        """``name``: one of this node's services (the actors' servers; its thread dying takes
        the actor with it unless ``crash_on_thread_death`` says otherwise); no name: a plain
        server on ``host`` (tests).  ``tls``: serve HTTPS if the node has a certificate
        (``start --tls-cert``; the gateways)."""
        self.app, self.name = app, name
        self.ssl = endpoints.server_ssl() if tls else None
        self.host = host or endpoints.bind_host()
        self.wanted = port or (endpoints.remembered_port(name) if name else 0)
        self.port = self.wanted
        self.loop = new_loop()
        self.beats = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        crash = bool(name) if crash_on_thread_death is None else crash_on_thread_death
        self._thread = guarded.start(self._run, f"http-{name or 'server'}", crash_process=crash)
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        if name:
            if self.wanted and self.port != self.wanted:
                endpoints.note_port_change(name, self.wanted, self.port)
            endpoints.remember_port(name, self.port)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.runner = web.AppRunner(self.app, access_log=None)
            self.loop.run_until_complete(self.runner.setup())
            try:
                self.port = self._listen(self.wanted)
            except OSError as e:
                remembered_only = self.wanted and self.name and self.wanted == endpoints.remembered_port(self.name)
                if not (remembered_only and endpoints.is_address_in_use(e)):
                    raise
                self.port = self._listen(0)     # the old port is taken: a new URL, logged
        except BaseException as e:  # noqa: BLE001 - reported to the constructor's caller
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.call_soon(self._beat)
        self.loop.run_forever()

    def _beat(self) -> None:
        """Counts turns of a live event loop: a loop that is blocked or dead stops counting,
        which the registry's watchdog sees (the gateway reports ``beats`` as its progress)."""
        self.beats += 1
        self.loop.call_later(BEAT_S, self._beat)

    def block(self, seconds: float) -> None:
        """Test hook: block the event loop (a handler stuck in a synchronous call)."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def _listen(self, port: int) -> int:
        site = web.TCPSite(self.runner, self.host, port, reuse_address=True, ssl_context=self.ssl)
        self.loop.run_until_complete(site.start())
        return site._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """The URL other hosts use (the node's advertised address, not the bind address)."""
        if self.name:
            return endpoints.url(self.port, tls=self.ssl is not None)
        return f"{'https' if self.ssl else 'http'}://{self.host}:{self.port}"

    def call(self, coro, timeout: float = 30):
        """Run a coroutine on the server's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving, letting requests in flight finish for up to ``grace_s``."""
        if self._error is not None or not self._thread.is_alive():
            return
        try:
            self.call(self.runner.cleanup(), timeout=grace_s)
        except TimeoutError:        # a blocked loop (what the watchdog restarts): the process exit frees the port
            log.warning("server %s did not stop within %g s; leaving it to the process exit",
                        self.name or self.port, grace_s)
            return
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(grace_s)
