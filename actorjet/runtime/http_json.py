"""One JSON-over-HTTP client for ActorJet's own calls: client mode, a runner's results,
the outbound runner's door, ``actorjet top``.

Synchronous (its callers are plain threads), keep-alive (one ``http.client`` connection per
thread and host: a runner posting each lease's rewards reuses it), and one error vocabulary:
``HttpError`` when the server answered with a status of 400 or more (its JSON message
extracted), ``Unreachable`` when no answer came.  A kept-alive connection the server has
closed meanwhile is retried once on a fresh one, as browsers and ``requests`` do.  (Agents'
LLM calls go through the ``openai`` SDK with runner/llm.py; servers' calls to each
other are aiohttp's, in their event loops.)
"""
from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

from actorjet.runtime import endpoints

_local = threading.local()


class HttpError(Exception):
    def __init__(self, url: str, status: int, message: str, resent: bool = False):
        super().__init__(f"{url}: {status} {message}")
        # resent: the request went out twice (the first connection dropped without an answer,
        # so the first may have landed): a caller that is not idempotent judges the answer
        self.url, self.status, self.message, self.resent = url, status, message, resent


class Unreachable(Exception):
    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot reach {url}: {reason}")
        self.url, self.reason = url, reason


ONE_WRITE_MAX = 256 * 1024       # larger bodies are sent as http.client sends them (no copy)


class _OneWrite:
    """A request in one write.  http.client sends the headers and then the body: two TCP
    segments, so the server reads twice and an aiohttp server wakes twice per call (its
    handler waits for the body): 4–7% of an aiohttp server's CPU per chat-sized request
    (bench/rollout_costs.py, "request read").  This overrides http.client's private
    ``_send_output``, unchanged since Python 3.6; a body that is not bytes, is sent chunked or
    is larger than ONE_WRITE_MAX keeps http.client's own path."""

    def _send_output(self, message_body=None, encode_chunked=False):
        if (not isinstance(message_body, (bytes, bytearray)) or encode_chunked
                or len(message_body) > ONE_WRITE_MAX):
            return super()._send_output(message_body, encode_chunked)
        self._buffer.extend((b"", b""))
        head = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(head + message_body)


class HTTPConnection(_OneWrite, http.client.HTTPConnection):
    pass


class HTTPSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


def _connection(scheme: str, host: str, port: int | None, timeout: float, fresh: bool) -> http.client.HTTPConnection:
    pool = _local.__dict__.setdefault("pool", {})
    key = (scheme, host, port)
    conn = pool.get(key)
    if conn is not None and fresh:
        conn.close()
        conn = None
    if conn is None:
        conn = (HTTPSConnection(host, port, timeout=timeout, context=endpoints.client_ssl())
                if scheme == "https" else HTTPConnection(host, port, timeout=timeout))
        pool[key] = conn
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn


def _message(raw: bytes) -> str:
    """The error message of an OpenAI-style error body, or the start of whatever it is."""
    try:
        body = json.loads(raw)
        return str(body["error"]["message"] if isinstance(body.get("error"), dict) else body["error"])
    except Exception:  # noqa: BLE001 - not our JSON: show what it is
        return raw.decode(errors="replace")[:200]


def request(method: str, url: str, body: dict | None = None, token: str | None = None,
            timeout: float = 30.0) -> dict:
    """Send ``body`` as JSON, return the answer's JSON object."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    for attempt in (0, 1):
        conn = _connection(parts.scheme, parts.hostname or "", parts.port, timeout, fresh=attempt == 1)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
            conn.close()
            if attempt == 0:
                continue                       # the server closed our idle connection: a fresh one
            raise Unreachable(url, str(e) or type(e).__name__) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise Unreachable(url, str(e) or type(e).__name__) from None
        if resp.status >= 400:
            raise HttpError(url, resp.status, _message(raw), resent=attempt == 1)
        try:
            return json.loads(raw)
        except ValueError:
            raise HttpError(url, resp.status, f"the answer is not JSON: {raw[:100]!r}") from None
    raise AssertionError("unreachable")


def post(url: str, body: dict, token: str | None = None, timeout: float = 30.0) -> dict:
    return request("POST", url, body, token, timeout)


def get(url: str, token: str | None = None, timeout: float = 30.0) -> dict:
    return request("GET", url, None, token, timeout)
