"""The cluster token at HTTP boundaries: one constant-time check for every service.

A plain ``!=`` on a secret leaks, through its timing, how many leading characters a guess got
right; ``hmac.compare_digest`` takes the same time whatever the guess.
"""
from __future__ import annotations

import hmac


def bearer_ok(header: str | None, token: str) -> bool:
    """Does an ``Authorization`` header carry ``Bearer <token>``?  (constant time)"""
    return hmac.compare_digest((header or "").encode(), f"Bearer {token}".encode())
