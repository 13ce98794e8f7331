"""Every use of the cluster token in one place: what is signed with it, and how it is checked.

The token is the swarm's one shared secret (docs/security.md).  It is never sent where a
proof will do, and each use derives its own MAC so that one signature can never be replayed
as another:

    bearer_ok        HTTP boundaries (gateway internals, engine, door): the token itself,
                     compared in constant time
    node_auth        a member's capabilities prove it knows the token without sending it
    mint_key/verify_key
                     per-episode API keys ``aj-<episode id>-<signature>``: a gateway checks
                     a key without a round trip to the registry
    behavior_mac     cloudpickled behaviors, checked *before* anything is unpickled
    frame_key, FrameMac
                     the key and the tag of every thespian frame (runtime/frames.py)

A plain ``!=`` on a secret leaks, through its timing, how many leading characters a guess
got right; every check here uses ``hmac.compare_digest``.  Kept free of any other ActorJet
import, so every layer may use it.
"""
from __future__ import annotations

import hashlib
import hmac
import re

SECRET_ENV = "ACTORJET_TOKEN"        # where a node's processes find the token they joined with
FRAME_INFO = b"actorjet thespian frames v1"
_KEY = re.compile(r"^aj-([a-z0-9_.]+)-([0-9a-f]{24})$")


def bearer_ok(header: str | None, token: str) -> bool:
    """Does an ``Authorization`` header carry ``Bearer <token>``?  (constant time)"""
    return hmac.compare_digest((header or "").encode(), f"Bearer {token}".encode())


def node_auth(token: str, node_id: str) -> str:
    """What a member puts in its capabilities: proves it knows the token without sending it."""
    return hmac.new(token.encode(), node_id.encode(), hashlib.sha256).hexdigest()


def mint_key(secret: str, episode_id: str) -> str:
    """An episode's API key.  The agent role travels separately (``X-ActorJet-Role``), so one
    key serves every role of an episode."""
    if not re.fullmatch(r"[a-z0-9_.]+", episode_id):
        raise ValueError(f"episode id {episode_id!r} must be lowercase letters, digits, '_' or '.'")
    return f"aj-{episode_id}-{_episode_mac(secret, episode_id)}"


def verify_key(secret: str, key: str) -> str | None:
    """The episode id a valid key belongs to, else None."""
    match = _KEY.match(key or "")
    if not match or not hmac.compare_digest(match.group(2), _episode_mac(secret, match.group(1))):
        return None
    return match.group(1)


def _episode_mac(secret: str, episode_id: str) -> str:
    return hmac.new(secret.encode(), episode_id.encode(), hashlib.sha256).hexdigest()[:24]


def behavior_mac(secret: str, name: str, version: int, blob: bytes) -> str:
    """The signature of (name, version, sha256(blob)): binds the code to its name and version."""
    digest = hashlib.sha256(blob).hexdigest()
    return hmac.new(secret.encode(), f"{name}\n{version}\n{digest}".encode(), hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time comparison of two signatures."""
    return hmac.compare_digest(a, b)


def frame_key(token: str) -> bytes:
    """HKDF-SHA256 (RFC 5869) of the cluster token: one 32-byte key for frames, distinct from
    every other use of the token."""
    prk = hmac.new(b"actorjet", token.encode(), hashlib.sha256).digest()
    return hmac.new(prk, FRAME_INFO + b"\x01", hashlib.sha256).digest()


class FrameMac:
    """HMAC-SHA256 tags under one key, for many small messages: the keyed state is computed
    once and copied per message (half the cost of a fresh ``hmac.new``)."""

    def __init__(self, key: bytes):
        self.key = key
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def tag(self, data) -> bytes:
        mac = self._keyed.copy()
        mac.update(data)
        return mac.digest()

    def ok(self, data, tag) -> bool:
        return hmac.compare_digest(tag, self.tag(data))
