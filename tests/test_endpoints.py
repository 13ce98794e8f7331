"""Where HTTP services listen, what URL they advertise, and that a restart keeps the port."""
import logging
import socket

from aiohttp import web

from actorjet.serving.serve import AppServer
from actorjet.runtime import endpoints


async def _health(request):
    return web.json_response({"ok": True})


def _app():
    app = web.Application()
    app.router.add_get("/healthz", _health)
    return app


def test_a_restarted_service_keeps_its_port_and_advertises_the_reachable_address(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(endpoints.BIND_ENV, "127.0.0.1")              # bind here,
    monkeypatch.setenv(endpoints.ADVERTISE_ENV, "192.0.2.7")         # advertise that
    monkeypatch.setenv(endpoints.NODE_DIR_ENV, str(tmp_path))
    first = AppServer(_app(), name="gateway.policy", crash_on_thread_death=False)
    port = first.port
    assert first.host == "127.0.0.1" and first.url == f"http://192.0.2.7:{port}"
    first.stop()
    again = AppServer(_app(), name="gateway.policy", crash_on_thread_death=False)    # a restart: the same URL
    assert again.port == port
    again.stop()

    with socket.socket() as squatter:                             # someone took the port meanwhile
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with caplog.at_level(logging.WARNING, logger="actorjet"):
            moved = AppServer(_app(), name="gateway.policy", crash_on_thread_death=False)
        assert moved.port != port
        assert f"port {port}" in caplog.text and "URL changed" in caplog.text
        moved.stop()
    assert endpoints.remembered_port("gateway.policy") == moved.port


def test_addresses_default_to_this_machine_only(monkeypatch):
    for key in (endpoints.BIND_ENV, endpoints.ADVERTISE_ENV, endpoints.NODE_DIR_ENV):
        monkeypatch.delenv(key, raising=False)
    assert endpoints.bind_host() == "127.0.0.1" and endpoints.advertise_host() == "127.0.0.1"
    monkeypatch.setenv(endpoints.BIND_ENV, "0.0.0.0")
    assert endpoints.advertise_host() == socket.gethostname()       # never advertise 0.0.0.0
