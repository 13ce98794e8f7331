"""Signed behavior payloads: cloudpickled code is verified *before* it is unpickled.

Unpickling runs code, so a runner must never unpickle a payload it cannot attribute to
its own swarm.  The registry signs (name, version, sha256(blob)) with an HMAC under the
cluster secret; a runner checks it with the secret its node was joined with (taken from
its own environment, not from the message that brought the payload).
"""
from __future__ import annotations

import os

import cloudpickle

from actorjet.signing import SECRET_ENV, behavior_mac as _mac, same


class BehaviorRejected(Exception):
    """A payload that is unsigned, tampered with, or signed with another key."""


class Unshippable(Exception):
    """Behavior code that cannot be cloudpickled (a user mistake, reported in one line)."""


def pickle_function(module, fn) -> bytes:
    """The function with its module pickled by value, so nodes need not have the file.

    Module-level objects the function reaches travel with it; a lock, thread-local, socket
    or open file cannot, and that is the user's to fix, so say which variable, in which file,
    and how."""
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - pickling fails with TypeError, PicklingError, ...
        where = getattr(module, "__file__", None) or module.__name__
        culprits = _unpicklable_globals(fn)
        what = (", ".join(f"{name} ({type(value).__name__})" for name, value in culprits) if culprits
                else f"something it uses ({e})")
        raise Unshippable(
            f"{where}: {getattr(fn, '__name__', fn)} cannot be shipped to runners: module-level {what} "
            "cannot be pickled. Module-level objects a behavior uses travel with it; create locks, "
            "thread-locals, connections and files inside the function (or lazily in an imported package)") from None


def _unpicklable_globals(fn) -> list[tuple[str, object]]:
    """The module-level names ``fn`` uses whose values cannot be pickled."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    names = set(code.co_names)
    for const in code.co_consts:           # names used by nested functions and lambdas
        if hasattr(const, "co_names"):
            names |= set(const.co_names)
    bad = []
    for name in sorted(names):
        if name in fn.__globals__:
            try:
                cloudpickle.dumps(fn.__globals__[name])
            except Exception:  # noqa: BLE001 - this one is the culprit
                bad.append((name, fn.__globals__[name]))
    return bad


def sign(secret: str, name: str, version: int, blob: bytes) -> dict:
    return {"name": name, "version": version, "blob": blob, "sig": _mac(secret, name, version, blob)}


def sign_upload(secret: str, name: str, blob: bytes, source: str = "") -> dict:
    """What `actorjet upgrade` sends: the registry accepts code only from holders of the secret."""
    return {"name": name, "blob": blob, "source": source, "sig": _mac(secret, "upload:" + name, 0, blob)}


def check_upload(secret: str, upload) -> str | None:
    """Why an upload is refused, or None.  Never unpickles."""
    if not isinstance(upload, dict) or not {"name", "blob", "sig"} <= set(upload):
        return "not a signed upload (raw pickles are refused)"
    if not isinstance(upload["blob"], bytes):
        return "the payload is not bytes"
    want = _mac(secret, "upload:" + str(upload["name"]), 0, upload["blob"])
    if not same(want, str(upload["sig"])):
        return "bad signature: tampered with, or signed with another cluster's token"
    return None


def load(payload, secret: str | None = None):
    """The behavior function, or BehaviorRejected saying why (nothing is unpickled then)."""
    secret = secret if secret is not None else os.environ.get(SECRET_ENV, "")
    if not secret:
        raise BehaviorRejected("this node has no cluster secret to check behaviors with")
    if not isinstance(payload, dict) or not {"name", "version", "blob", "sig"} <= set(payload):
        raise BehaviorRejected("not a signed behavior payload (raw pickles are refused)")
    want = _mac(secret, payload["name"], payload["version"], payload["blob"])
    if not same(want, str(payload["sig"])):
        raise BehaviorRejected(f"bad signature on {payload['name']} v{payload['version']}: "
                               "tampered with, or signed with another cluster's key")
    return cloudpickle.loads(payload["blob"])
