"""Where this node's HTTP services listen, which URL they give other hosts, and which port
each one had last time.

Hosts share nothing (docs/architecture.md, "Addresses"): a URL that another host receives
must name an address that host can reach.  The process that starts a node's actor system
(`actorjet start`, `actorjet join`) decides, once, and puts it in the environment that
every actor of the node inherits:

    ACTORJET_BIND        the address HTTP services bind to (``--host`` / ``--bind``)
    ACTORJET_ADVERTISE   the address put in their URLs (``--advertise``; default: the bind
                         address, or the address that faces the head for a joined node)
    ACTORJET_NODE_DIR    this node's own directory (ports, and later anything node-local)
    ACTORJET_NODE_NAME   the node's name (``head``, or ``join --name``), for status
    ACTORJET_TLS_CERT/KEY  the gateways of this node serve HTTPS with this certificate
    ACTORJET_TLS_CA      extra certificate(s) this node's clients trust for the gateways
                         (a self-signed gateway certificate: give the certificate itself)

A service's port is remembered per node in ``NODE_DIR/ports.json`` under its name (e.g.
``gateway.policy``), so a restarted gateway comes back on the same URL and runners and
client-mode users keep working.  If that port is taken meanwhile, the service takes a
fresh one and says so in the log.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import ssl
from pathlib import Path

from actorjet.errors import UserError
from actorjet.runtime.logs import log

BIND_ENV, ADVERTISE_ENV, NODE_DIR_ENV = "ACTORJET_BIND", "ACTORJET_ADVERTISE", "ACTORJET_NODE_DIR"
NODE_NAME_ENV = "ACTORJET_NODE_NAME"
TLS_CERT_ENV, TLS_KEY_ENV, TLS_CA_ENV = "ACTORJET_TLS_CERT", "ACTORJET_TLS_KEY", "ACTORJET_TLS_CA"


def set_node_addresses(bind: str, advertise: str, node_dir: Path, name: str = "") -> None:
    """Called by the starter process before its actor system exists (actors inherit it)."""
    os.environ[NODE_NAME_ENV] = name
    os.environ[BIND_ENV] = bind
    os.environ[ADVERTISE_ENV] = advertise
    os.environ[NODE_DIR_ENV] = str(node_dir)


def bind_host() -> str:
    return os.environ.get(BIND_ENV, "127.0.0.1")


def advertise_host() -> str:
    host = os.environ.get(ADVERTISE_ENV) or bind_host()
    return socket.gethostname() if host in ("0.0.0.0", "") else host


def node_dir() -> Path | None:
    value = os.environ.get(NODE_DIR_ENV)
    return Path(value) if value else None


def local_run_dir(context: dict) -> Path:
    """Where this node keeps the run's files (weights, checkpoints): the run directory on
    the head; ``NODE_DIR/runs/RUN_ID`` on a member — never a path of another host's."""
    run_dir = Path(context["run_dir"])
    here = node_dir()
    if here is None or here.resolve() == run_dir.resolve():
        return run_dir
    local = here / "runs" / str(context.get("run_id") or "run")
    local.mkdir(parents=True, exist_ok=True)
    return local


def url(port: int, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://{advertise_host()}:{port}"


def set_tls(cert: str | None, key: str | None, ca: str | None) -> None:
    """Checked once by the starter (a clear error now, not in an actor later); the node's
    actors inherit it.  Without ``ca``, a node that serves with ``cert`` trusts it itself."""
    if bool(cert) != bool(key):
        raise UserError("--tls-cert and --tls-key go together")
    try:
        if cert:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        if ca:
            ssl.create_default_context().load_verify_locations(ca)
    except (OSError, ssl.SSLError) as e:
        raise UserError(f"TLS files: {e}") from None
    for name, value in ((TLS_CERT_ENV, cert), (TLS_KEY_ENV, key), (TLS_CA_ENV, ca or cert)):
        if value:
            os.environ[name] = str(Path(value).resolve())


def server_ssl() -> ssl.SSLContext | None:
    """The gateways' TLS context on this node (None: plain HTTP)."""
    cert, key = os.environ.get(TLS_CERT_ENV), os.environ.get(TLS_KEY_ENV)
    if not cert or not key:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_ssl() -> ssl.SSLContext | None:
    """What this node's clients of an https gateway verify it with: the system's roots plus
    ACTORJET_TLS_CA (None: the defaults).  Built once per CA file: loading the system's roots
    takes milliseconds, and runners and client mode call this per request."""
    ca = os.environ.get(TLS_CA_ENV)
    return _trusting(ca) if ca else None


@functools.lru_cache(maxsize=4)
def _trusting(ca: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(ca)
    return ctx


def remembered_port(name: str) -> int:
    """The port service ``name`` had on this node before (0: none)."""
    book = _book_path()
    try:
        return int(json.loads(book.read_text()).get(name, 0)) if book else 0
    except (OSError, ValueError, AttributeError):
        return 0


def remember_port(name: str, port: int) -> None:
    book = _book_path()
    if book is None:
        return
    book.parent.mkdir(parents=True, exist_ok=True)
    with open(book.with_suffix(".lock"), "w") as lock:    # engine and gateway start together
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(book.read_text()) if book.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[name] = port
        tmp = book.with_name(f"ports.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(book)


def choose_port(name: str, configured: int = 0) -> int:
    """The port to try first: the configured one, else the one this service had before."""
    return configured or remembered_port(name)


def is_address_in_use(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.EADDRINUSE


def note_port_change(name: str, wanted: int, got: int) -> None:
    log.warning("%s: port %d (its port before the restart) is taken; serving on %d instead, "
                "so its URL changed", name, wanted, got)


def _book_path() -> Path | None:
    base = node_dir()
    return base / "ports.json" if base else None
