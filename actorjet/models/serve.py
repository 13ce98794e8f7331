"""Run an aiohttp application in a background thread with its own event loop.

Actors are driven by thespian's loop, so their HTTP servers (gateway, engine) live in a
thread beside it; ``stop()`` closes the listening socket so a restart can bind again.
"""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class AppServer:
    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0):
        self.app, self.host, self.port = app, host, port
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.runner = web.AppRunner(self.app, access_log=None)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
        except BaseException as e:  # noqa: BLE001 - reported to the constructor's caller
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def call(self, coro, timeout: float = 30):
        """Run a coroutine on the server's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._error is not None or not self._thread.is_alive():
            return
        try:
            self.call(self.runner.cleanup(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
