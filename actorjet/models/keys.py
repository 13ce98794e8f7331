"""Per-episode API keys: ``aj-<episode id>-<signature>``.

The signature is an HMAC of the episode id under the cluster secret, so a gateway checks
a key without a round trip to the registry, and nobody without the secret can invent
one.  The agent role travels separately (``X-ActorJet-Role`` header), so one key serves
every role of an episode.
"""
from __future__ import annotations

import hashlib
import hmac
import re

_KEY = re.compile(r"^aj-([a-z0-9_.]+)-([0-9a-f]{24})$")


def mint(secret: str, episode_id: str) -> str:
    if not re.fullmatch(r"[a-z0-9_.]+", episode_id):
        raise ValueError(f"episode id {episode_id!r} must be lowercase letters, digits, '_' or '.'")
    return f"aj-{episode_id}-{_sign(secret, episode_id)}"


def verify(secret: str, key: str) -> str | None:
    """The episode id a valid key belongs to, else None."""
    match = _KEY.match(key or "")
    if not match or not hmac.compare_digest(match.group(2), _sign(secret, match.group(1))):
        return None
    return match.group(1)


def _sign(secret: str, episode_id: str) -> str:
    return hmac.new(secret.encode(), episode_id.encode(), hashlib.sha256).hexdigest()[:24]
