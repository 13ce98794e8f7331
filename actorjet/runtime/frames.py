"""Authenticated actor transport: every thespian TCP frame carries an HMAC of its bytes,
checked before anything is unpickled.

thespian's TCP transport unpickles whatever arrives on an actor or admin port, so anyone who
can reach a port could run code there.  Its frames are built and read through one module-level
serializer (``thespian.system.transport.TCPTransport.serializer``) plus two pre-built ACK frames.
``install(token)`` replaces both, in this process and every process that forks from it later
(thespian forks its admin and actors): a frame is ``tag || pickle`` with ``tag =
HMAC-SHA256(key, pickle)``, the key derived from the cluster token (HKDF-SHA256).  A frame
whose tag does not verify (constant-time) is dropped unread: ``loads`` returns a marker that
thespian's receive path rejects as malformed, the frame is counted, and the peer is logged at
most once per ``LOG_EVERY_S``.  Frames are authenticated, not encrypted, and not protected
against replay (docs/security.md).

The counter lives per process; a process started under a node directory also writes it to
``NODE_DIR/security/rejected.PID``, which the node's status reads (``rejected_frames``).
"""
from __future__ import annotations

import fcntl
import os
import pickle
import time
from pathlib import Path

from actorjet.errors import UserError
from actorjet.runtime import endpoints
from actorjet.signing import FrameMac, frame_key
from actorjet.runtime.logs import log

THESPIAN_VERSION = "4.0.1"        # the transport shape below was checked against this release
TAG_BYTES = 32
LOG_EVERY_S = 10.0


class Rejected:
    """What ``loads`` returns for a frame that failed authentication: not iterable and not a
    control message, so thespian's receive path drops it as malformed and never delivers it."""

    def __repr__(self) -> str:
        return "<unauthenticated frame, dropped unread>"


REJECTED = Rejected()


class SignedPickle:
    """The serializer thespian's TCP transport uses once ``install`` ran (``dumps``/``loads``)."""

    def __init__(self, key: bytes):
        self.key = key
        self.rejected = 0
        self._logged: dict[str, float] = {}

    @property
    def key(self) -> bytes:
        return self._mac.key

    @key.setter
    def key(self, key: bytes) -> None:
        self._mac = FrameMac(key)

    def tag(self, data) -> bytes:
        return self._mac.tag(data)

    def dumps(self, obj) -> bytes:
        data = pickle.dumps(obj)
        return self.tag(data) + data

    def loads(self, frame: bytes):
        view = memoryview(frame)
        tag, data = view[:TAG_BYTES], view[TAG_BYTES:]
        if len(tag) == TAG_BYTES and self._mac.ok(data, tag):
            return pickle.loads(data)
        self.rejected += 1
        _write_count(self.rejected)
        return REJECTED

    def note_peer(self, peer: str) -> None:
        """Log a rejected frame's sender, at most once per LOG_EVERY_S for each address."""
        now = time.monotonic()
        if now - self._logged.get(peer, 0.0) >= LOG_EVERY_S:
            self._logged[peer] = now
            log.warning("actor transport: dropped an unauthenticated frame from %s (pid %d has dropped %d; "
                        "a node with another cluster's token, or someone probing the port)",
                        peer, os.getpid(), self.rejected)


_signer: SignedPickle | None = None


def install(token: str) -> None:
    """Sign and verify every actor frame of this process (and its future children) with the
    key of ``token``.  Call before an actor system starts or is attached to."""
    global _signer
    if not token:
        raise UserError("the actor transport needs the cluster token (pass --token, or --run-dir of the head)")
    transport, buffers = _thespian_transport()
    key = frame_key(token)
    if _signer is None:
        _signer = SignedPickle(key)
        _wrap_incoming(transport)
    _signer.key = key
    transport.serializer = _signer
    transport.ackMsg = buffers.toSendBuffer(buffers.ackPacket, _signer.dumps)
    transport.ackDataErrMsg = buffers.toSendBuffer(buffers.ackDataErrPacket, _signer.dumps)


def installed() -> bool:
    return _signer is not None


def rejected_here() -> int:
    return _signer.rejected if _signer is not None else 0


def rejected_on_node(node_dir: Path | None = None) -> int:
    """Frames dropped by every process of this node so far (their count files).  The files of
    processes that are gone are folded into ``rejected.retired`` (under a lock: several
    processes read), so a week of restarts leaves one file, not one per process."""
    folder = (node_dir or endpoints.node_dir() or Path("/nonexistent")) / "security"
    if not folder.is_dir():
        return 0
    try:
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            retired = _read_count(folder / "rejected.retired")
            total, gone = 0, 0
            for path in folder.glob("rejected.*"):
                pid = path.suffix[1:]
                if not pid.isdigit():
                    continue
                count = _read_count(path)
                if _alive(int(pid)):
                    total += count
                else:
                    gone += count
                    path.unlink(missing_ok=True)
            if gone:
                tmp = folder / "retired.tmp"
                tmp.write_text(str(retired + gone))
                os.replace(tmp, folder / "rejected.retired")
            return total + retired + gone
    except OSError:
        return 0


def _read_count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_count(count: int) -> None:
    here = endpoints.node_dir()
    if here is None:
        return
    try:
        (here / "security").mkdir(parents=True, exist_ok=True)
        (here / "security" / f"rejected.{os.getpid()}").write_text(str(count))
    except OSError:
        pass


def _thespian_transport():
    """The two thespian modules patched here, after checking they still have the expected shape."""
    import thespian
    from thespian.system.transport import TCPTransport, streamBuffer

    version = getattr(thespian, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("thespian")
    expected = [hasattr(TCPTransport, name) for name in ("serializer", "ackMsg", "ackDataErrMsg", "TCPIncoming_Common")]
    expected += [hasattr(streamBuffer, name) for name in ("toSendBuffer", "ackPacket", "ackDataErrPacket")]
    data = getattr(getattr(TCPTransport, "TCPIncoming_Common", None), "data", None)
    if version != THESPIAN_VERSION or not all(expected) or not isinstance(data, property):
        raise RuntimeError(f"thespian {version} is installed, but ActorJet's frame authentication was built for "
                           f"thespian {THESPIAN_VERSION}'s TCP transport; refusing to run unauthenticated "
                           f"(pip install thespian=={THESPIAN_VERSION})")
    return TCPTransport, streamBuffer


def _wrap_incoming(transport) -> None:
    """Name the sender of a rejected frame: the one place that knows the socket."""
    read = transport.TCPIncoming_Common.data.fget

    def data(incoming):
        result = read(incoming)
        if result is not None and result[0] is REJECTED:
            try:
                peer = "%s:%d" % incoming.socket.getpeername()[:2]
            except (OSError, AttributeError, TypeError):
                peer = "an unknown peer"
            _signer.note_peer(peer)
        return result

    transport.TCPIncoming_Common.data = property(data)
