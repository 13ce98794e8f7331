"""What a behavior receives as ``llm``: where each model is, and ready `openai` clients.

    def behavior(task, llm):
        reply = llm.client().chat.completions.create(model=llm.model(), messages=[...])
        judge = llm.client("judge", role="verifier")      # another model, another role
        ...

One key serves every model and role of the episode; the role travels in the
``X-ActorJet-Role`` header so the learner can credit each role's calls separately.
The clients retry 503s from a restarting engine (honouring Retry-After).

Below the clients sits a lean HTTP transport (``LeanTransport``, at the end of this file).
Why: an episode of a short-answer task is one SDK call, and on a CPU machine the SDK's own
CPU competes with the engine and the learner for the same cores.  About a quarter of a call's
client CPU is httpx's default transport (httpcore's connection pool and h11's parser);
``http.client`` from the standard library does the same keep-alive HTTP/1.1 for a fraction of
it (measured in bench/vs_trl.py's closing notes: docs/quickstart.md, "Against TRL").

The SDK stays what the agent uses: this only plugs in below it, through the ``http_client``
argument the SDK offers for that.  One connection per (thread, host): a behavior runs on one
thread, and ``http.client`` connections are not shared between threads.  A connection the
server closed while idle is retried once on a fresh one (the request has not been read);
errors become httpx's own exception types, so the SDK's retries and messages are unchanged.
Proxy settings from the environment are not used: a runner talks to its swarm's gateways
directly.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import threading
from typing import Iterator

import openai

from actorjet.runtime import endpoints, http_json

_shared = threading.local()


def _base_client(base_url: str, role: str) -> openai.OpenAI:
    """One HTTP connection pool per (thread, model, role): creating clients is not free."""
    cache = getattr(_shared, "clients", None)
    if cache is None:
        cache = _shared.clients = {}
    key = (base_url, role)
    if key not in cache:
        trust = endpoints.client_ssl() if base_url.startswith("https:") else None   # a self-signed gateway
        http = openai.DefaultHttpxClient(transport=LeanTransport(trust))
        cache[key] = openai.OpenAI(base_url=base_url, api_key="unset", max_retries=6, timeout=600,
                                   default_headers={"X-ActorJet-Role": role}, http_client=http)
    return cache[key]


class LLM:
    def __init__(self, urls: dict[str, str], api_key: str, episode_id: str = ""):
        if not urls:
            raise ValueError("no model is being served")
        self.urls, self.api_key, self.episode_id = dict(urls), api_key, episode_id
        self.default = next(iter(self.urls))

    def models(self) -> list[str]:
        return list(self.urls)

    def model(self, name: str | None = None) -> str:
        """The model name to pass as ``model=`` (the first model when none is named)."""
        name = name or self.default
        if name not in self.urls:
            raise KeyError(f"no model {name!r} in this swarm (models: {', '.join(self.urls)})")
        return name

    def base_url(self, name: str | None = None) -> str:
        return self.urls[self.model(name)]

    def client(self, name: str | None = None, role: str = "default") -> openai.OpenAI:
        return _base_client(self.base_url(name), role).with_options(api_key=self.api_key)


# -- the transport below the SDK ---------------------------------------------------------
# The httpx the installed SDK is built on (newer releases vendor it as ``httpx2``): the
# transport must subclass that one's BaseTransport and return that one's Response.
httpx = openai._base_client.httpx2 if hasattr(openai._base_client, "httpx2") else openai._base_client.httpx

CHUNK = 64 * 1024


class _Body(httpx.SyncByteStream):
    """The response body, read as the SDK asks (whole, or chunk by chunk when streaming)."""

    def __init__(self, response: http.client.HTTPResponse, on_close):
        self.response, self.on_close = response, on_close
        self.whole = False          # read to its end: the connection can carry the next request

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = self.response.read1(CHUNK)       # chunked or Content-Length alike
            except socket.timeout as e:
                raise httpx.ReadTimeout(str(e) or "timed out") from None
            except (OSError, http.client.HTTPException) as e:
                raise httpx.ReadError(str(e)) from None
            if not chunk:
                self.whole = True
                return
            yield chunk

    def close(self) -> None:
        self.on_close(self.response, self.whole)


class LeanTransport(httpx.BaseTransport):
    def __init__(self, verify: ssl.SSLContext | None = None):
        self.verify = verify
        self.local = threading.local()

    def _connection(self, url, timeout: float | None, fresh: bool) -> http.client.HTTPConnection:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        key = (url.scheme, url.host, url.port)
        conn = conns.get(key)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            if url.scheme == "https":
                context = self.verify or endpoints.client_ssl() or ssl.create_default_context()
                conn = http_json.HTTPSConnection(url.host, url.port or 443, timeout=timeout, context=context)
            else:
                conn = http_json.HTTPConnection(url.host, url.port or 80, timeout=timeout)
            conns[key] = conn
        elif conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.timeout = timeout
        return conn

    def handle_request(self, request: "httpx.Request") -> "httpx.Response":
        timeouts = request.extensions.get("timeout") or {}
        timeout = timeouts.get("read") or timeouts.get("connect")
        body = request.read()
        target = request.url.raw_path.decode("ascii")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        for attempt in range(2):
            conn = self._connection(request.url, timeout, fresh=attempt > 0)
            reused = conn.sock is not None
            try:
                conn.putrequest(request.method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                conn.endheaders(body or None)
                response = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                if reused and attempt == 0:          # the server had closed an idle connection
                    continue
                raise httpx.RemoteProtocolError(str(e), request=request) from None
            except socket.timeout as e:
                conn.close()
                raise httpx.ReadTimeout(str(e) or "timed out", request=request) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise httpx.ConnectError(str(e), request=request) from None

        def done(resp: http.client.HTTPResponse, whole: bool) -> None:
            # Read to its end, the connection is kept for the next call (keep-alive).  Note that
            # http.client does not mark a Content-Length body read with read1 as closed, so
            # ``isclosed()`` cannot tell: every call opened a new connection (a TCP connect
            # and accept per LLM call, on both sides).  An unread rest (a stream left early):
            # the connection cannot be reused.
            if not whole and not resp.isclosed():
                conn.close()
            resp.close()

        return httpx.Response(response.status, headers=response.getheaders(), stream=_Body(response, done),
                              extensions={"http_version": b"HTTP/1.1"})

    def close(self) -> None:
        for conn in getattr(self.local, "conns", {}).values():
            conn.close()
