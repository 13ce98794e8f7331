"""Starting, finding and stopping thespian actor systems (one per node).

Everything that touches ports and processes is here, so the rest of the code never
guesses: which address to advertise, where thespian logs, whether a port holds a stale
system, which processes belong to a system (thespian's admin daemonizes into its own
session, so "the head's processes" = the admin's session).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
from thespian.actors import ActorSystem, InvalidActorAddress

from actorjet.errors import UserError
from actorjet.runtime import endpoints, frames, logs, owner_watch

BASE = "multiprocTCPBase"
log = logging.getLogger("actorjet")
GIVE_UP_CHECK_S = 0.2     # how often ``ask`` checks whether to stop waiting


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a service that binds it a moment later.  It is drawn below the
    kernel's ephemeral range: a port the kernel handed out and took back there can go straight
    to the next outgoing or client socket (the starting system's own), and then the admin
    cannot bind it and never comes up (seen once in 30 heads started in a row)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:         # a crowded range: any port the kernel gives
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768            # Linux's default, and a fine floor elsewhere


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def check_reachable(host: str, port: int, timeout_s: float) -> None:
    """Fail fast, with a clear message, when the head cannot be reached at all."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.timeout:
        why = f"no answer within {timeout_s:g} s"
    except OSError as e:
        why = e.strerror or str(e)
    raise UserError(f"cannot reach the head at {host}:{port}: {why} "
                    "(is `actorjet start` running there, and is the port open?)")


def address_towards(host: str, port: int) -> str:
    """The local IP address that packets to host:port leave from (what to advertise)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def thespian_log_defs(log_dir: Path) -> dict:
    """Where thespian's logging process writes what reaches the root logger: one writer, so
    the stdlib's rotation by size is right here (thespian's own thespian.log is capped by
    thespian, THESPLOG_FILE_MAXSIZE)."""
    return {"version": 1, "disable_existing_loggers": False,
            "handlers": {"file": {"class": "logging.handlers.RotatingFileHandler", "level": "WARNING",
                                  "filename": str(log_dir / "thespian-root.log"), "maxBytes": logs.MAX_BYTES,
                                  "backupCount": logs.BACKUPS}},
            "root": {"handlers": ["file"], "level": "WARNING"}}


def start_actor_system(capabilities: dict, log_dir: Path, advertise_ip: str, token: str,
                       bind_ip: str | None = None, node_dir: Path | None = None,
                       preload: Callable[[], None] | None = None) -> ActorSystem:
    """Start (not attach to) an actor system with these capabilities, logging under log_dir.

    ``advertise_ip`` is what other hosts reach this node at (thespian's and the HTTP
    services' URLs); ``bind_ip`` is where the HTTP services listen (default: the same).
    Every actor frame is signed with ``token``'s key and checked before it is unpickled
    (runtime/frames.py); the admin and the actors fork from here and inherit it, and what
    ``preload`` imports (runtime/kinds.py)."""
    logs.configure(log_dir)
    endpoints.set_node_addresses(bind_ip or advertise_ip, advertise_ip, node_dir or log_dir.parent,
                                 str(capabilities.get("name", "")))
    frames.install(token)
    os.environ["THESPLOG_FILE"] = str(log_dir / "thespian.log")
    os.environ.setdefault("THESPLOG_THRESHOLD", "WARNING")
    os.environ["THESPIAN_BASE_IPADDR"] = advertise_ip
    # Actors inherit this: several torch processes share the cores, idle pools must not spin.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    port = capabilities["Admin Port"]
    if port_in_use("127.0.0.1", port) or port_in_use(advertise_ip, port):
        raise UserError(f"port {port} is already in use; pick another with --port "
                        f"(or `actorjet stop --port {port}` if it is a stale ActorJet system)")
    if preload is not None:
        preload()               # after OMP_WAIT_POLICY: OpenMP reads it when torch loads it
    try:
        asys = ActorSystem(BASE, capabilities, logDefs=thespian_log_defs(log_dir), transientUnique=True)
    except InvalidActorAddress as e:
        raise UserError(f"the actor system did not come up on {advertise_ip}:{port} within 11 s ({e}); "
                        f"is {advertise_ip} an address of this machine? see {log_dir}") from None
    asys._actorjet_watch = owner_watch.start(port, admin_pid(port))   # it ends with this process
    return asys


def attach(port: int, token: str | None = None) -> ActorSystem:
    """A client handle on the local system at ``port`` (never starts a new one).  Its frames
    are signed with ``token`` (or the key this process already installed).

    A system that holds another token answers within a fraction of a second with frames this
    process drops; thespian itself would keep asking for ~14 s before it gave up, so the
    handshake runs on a helper thread and the first dropped frame is the answer."""
    if not port_in_use("127.0.0.1", port):
        raise UserError(f"no ActorJet system is listening on port {port}")
    if token:
        frames.install(token)
    elif not frames.installed():
        raise UserError("talking to a head needs the cluster token: pass --token, or --run-dir of the head")
    rejected = frames.rejected_here()
    result: dict = {}

    def handshake() -> None:
        try:
            result["system"] = ActorSystem(BASE, {"Admin Port": port}, transientUnique=True)
        except Exception as e:  # noqa: BLE001 - reported by the caller's thread below
            result["error"] = e

    helper = threading.Thread(target=handshake, name="attach", daemon=True)
    helper.start()
    while helper.is_alive() and frames.rejected_here() == rejected:
        helper.join(0.05)
    if "system" in result:
        return result["system"]
    if frames.rejected_here() > rejected:     # it answered, with frames signed by another key
        raise UserError(f"the system on port {port} refused this command: wrong token")
    if isinstance(result.get("error"), InvalidActorAddress):
        raise UserError(f"the system on port {port} did not answer (is it an ActorJet head, and is the "
                        "token right?)")
    raise result["error"]


def ask(asys: ActorSystem, address, message, reply_type: type, timeout_s: float, give_up=None):
    """``asys.ask`` for a reply of ``reply_type`` (None: none within ``timeout_s``, or once
    ``give_up()``, checked every GIVE_UP_CHECK_S, is true: e.g. the asked actor's process is gone).

    An outside process's ask returns the first message that reaches it, and an answer that came
    after its ask timed out reaches the next ask instead: from then on every ask of that process
    would read its predecessor's answer.  Messages already waiting, and any of another type
    that arrives meanwhile, are set aside for ``listen`` (a head's ``Escalated`` must still
    reach its poll loop)."""
    aside = unread(asys)
    while (early := asys.listen(0)) is not None:
        aside.append(early)
    deadline = time.monotonic() + timeout_s
    wait = (lambda: max(0.0, deadline - time.monotonic())) if give_up is None else \
        (lambda: min(GIVE_UP_CHECK_S, max(0.0, deadline - time.monotonic())))
    reply = asys.ask(address, message, wait())
    while not isinstance(reply, reply_type) and time.monotonic() < deadline:
        if reply is not None:
            aside.append(reply)
        elif give_up is None or give_up():
            break
        reply = asys.listen(wait())
    return reply if isinstance(reply, reply_type) else None


def listen(asys: ActorSystem, timeout_s: float):
    """The next message for this outside process: one ``ask`` set aside first, else ``asys.listen``."""
    aside = unread(asys)
    return aside.popleft() if aside else asys.listen(timeout_s)


def unread(asys: ActorSystem) -> collections.deque:
    """Messages ``ask`` set aside (bounded: stale answers nobody reads again fall off)."""
    if not hasattr(asys, "_actorjet_unread"):
        asys._actorjet_unread = collections.deque(maxlen=64)
    return asys._actorjet_unread


def admin_pid(port: int) -> int | None:
    """The pid of the process listening on ``port`` (the thespian admin), if any."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    return None


def system_processes(port: int) -> list[psutil.Process]:
    """The admin on ``port`` and every actor process of its system (same session id)."""
    pid = admin_pid(port)
    try:
        return [] if pid is None else session_processes(os.getsid(pid))
    except ProcessLookupError:      # the admin exited between the port scan and here
        return []


def session_processes(sid: int) -> list[psutil.Process]:
    procs = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(p.pid) == sid:
                procs.append(p)
    return procs


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a process started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_head_of(run_dir: str | Path) -> list[int]:
    """SIGKILL the actor system of the head whose run directory this is, if it outlived the
    process that embedded it.  Its admin daemonizes into a session of its own, so stopping the
    embedding process's group does not reach it (a research trial's head, pruned while it
    stopped slowly on a busy machine, trained on; seen in the chain test).  Only the admin
    ``head.json`` names, by PID and start time, is touched (not its command line: a study's
    trials are forked from one trial server and all carry its command line)."""
    import json

    try:
        info = json.loads((Path(run_dir) / "head.json").read_text())
        admin = int(info["admin_pid"])
        if not owner_watch.alive(admin, float(info["admin_started"])):
            return []               # gone, or its PID reused by something that is not ours
        sid = os.getsid(admin)
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return []
    killed = []
    for p in session_processes(sid):
        with contextlib.suppress(psutil.Error):
            p.kill()
            killed.append(p.pid)
    return killed


def shutdown_system(port: int, timeout_s: float = 10.0, token: str | None = None) -> bool:
    """Stop the system on ``port`` politely (only possible with its token), then by signal
    if it does not go away."""
    procs = system_processes(port)
    if not procs:
        return False
    if token:
        frames.install(token)
    if frames.installed():
        with contextlib.suppress(Exception):
            ActorSystem(BASE, {"Admin Port": port}, transientUnique=True).shutdown()
    else:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
    reap(procs, timeout_s)
    return True


def reap(procs: list[psutil.Process], timeout_s: float) -> int:
    """Wait for a stopped system's processes; kill those still there after ``timeout_s``
    (thespian gives up on an admin that does not answer its shutdown).  How many were killed.

    A process that exited is done even while it is a zombie: the admin daemonizes, so its
    parent is PID 1, and a container's PID 1 may reap late (here ~1.7 s after the exit, which
    psutil.wait_procs waited for on every stop)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if p.pid != os.getpid()]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if still_running(p)]
        if alive:
            time.sleep(0.05)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(alive)


def still_running(p: psutil.Process) -> bool:
    """Alive and not a zombie (an exited process waiting for its parent to reap it)."""
    try:
        if p.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
    with contextlib.suppress(psutil.Error, ChildProcessError):
        p.wait(0)                   # a child of this process: reap it here
    return False
