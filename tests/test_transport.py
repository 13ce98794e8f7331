"""The lean transport under the `openai` clients behaviors get (runner/llm.py): the SDK
must see exactly what it would see with its own transport: retries, dropped connections,
timeouts and dead servers here; answers, streams and the gateway's errors in test_gateway.py;
https in test_security.py (a runner on another host calls the https gateway through it)."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from actorjet import signing
from actorjet.runner.llm import LLM

SECRET = "transport-test-secret"
ANSWER = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def llm(url: str, episode: str) -> LLM:
    return LLM({"tiny": url}, signing.mint_key(SECRET, episode), episode)


class Scripted(BaseHTTPRequestHandler):
    """Answers as told by the server's ``script`` (one entry per request, then 200s)."""
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        step = self.server.script.pop(0) if self.server.script else "ok"
        self.server.seen.append(step)
        self.server.ports.append(self.client_address[1])     # one port per client connection
        if step == "busy":
            body = json.dumps({"error": {"message": "engine restarting"}}).encode()
            self.send_response(503)
            self.send_header("Retry-After", "0")
        elif step == "hang":
            threading.Event().wait(3)
            return
        else:
            body = json.dumps(ANSWER).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if step == "close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        if step == "drop-after":          # answers, then drops the kept-alive connection while idle
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    server.script, server.seen, server.ports = [], [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def ask(client):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}], max_tokens=2)


def test_503_is_retried_and_a_dropped_idle_connection_is_reopened(scripted):
    server, url = scripted
    client = llm(url, "t3").client()
    server.script[:] = ["busy", "busy", "drop-after", "close"]
    assert ask(client).choices[0].message.content == "42"        # two 503s (the SDK retries), then the answer
    once = client.with_options(max_retries=0)                    # below the SDK's retries:
    assert ask(once).choices[0].message.content == "42"          # over a connection the server had closed
    assert ask(once).choices[0].message.content == "42"          # after a Connection: close
    assert server.seen == ["busy", "busy", "drop-after", "close", "ok"]


def test_an_agents_calls_from_one_thread_share_one_kept_alive_connection(scripted):
    """An answer read to its end leaves the connection open for the next call (it did not:
    http.client never marks a Content-Length body read with read1 as closed, and every call
    opened a new connection — a TCP connect and accept per LLM call on both sides)."""
    server, url = scripted
    for k in range(4):
        assert ask(llm(url, f"t{k}").client()).choices[0].message.content == "42"   # a new episode each time
    assert len(server.ports) == 4 and len(set(server.ports)) == 1
    stream = llm(url, "t9").client().chat.completions.create(model="tiny", messages=[], stream=False,
                                                            max_tokens=2)
    assert stream.choices[0].message.content == "42" and len(set(server.ports)) == 1


def test_timeouts_and_dead_servers_are_the_sdks_errors(scripted):
    server, url = scripted
    server.script[:] = ["hang"]
    quick = llm(url, "t4").client().with_options(timeout=0.5, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        ask(quick)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"        # bound, never listening: refused
    with pytest.raises(openai.APIConnectionError):
        ask(llm(dead, "t5").client().with_options(max_retries=0))


def test_the_json_client_keeps_connections_alive_and_names_errors(scripted):
    """runtime/http_json.py: ActorJet's own calls (client mode, results, the door, top)."""
    from actorjet.runtime import http_json

    server, url = scripted
    for _ in range(3):
        assert http_json.post(url + "/x", {"a": 1})["id"] == "x"
    assert len(set(server.ports)) == 1                        # one kept-alive connection
    server.script = ["drop-after"]
    http_json.post(url + "/x", {})
    assert http_json.post(url + "/x", {})["id"] == "x"          # the server closed it: a fresh one
    assert len(set(server.ports)) == 2
    server.script = ["busy"]
    with pytest.raises(http_json.HttpError) as err:
        http_json.post(url + "/x", {})
    assert err.value.status == 503 and err.value.message == "engine restarting"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"          # bound, not listening: refused
        with pytest.raises(http_json.Unreachable):
            http_json.post(dead + "/x", {}, timeout=2)


def test_a_request_leaves_in_one_write(scripted, monkeypatch):
    """http.client writes the headers, then the body: two TCP segments, two reads (and two
    wakeups of an aiohttp gateway) per LLM call.  Both clients send a request in one write."""
    from actorjet.runtime import http_json

    server, url = scripted
    writes = []
    real = socket.socket.sendall

    def sendall(sock, data, *args):
        if threading.current_thread() is threading.main_thread():      # not the server's answers
            writes.append(bytes(data))
        return real(sock, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", sendall)
    assert ask(llm(url, "t6").client()).choices[0].message.content == "42"
    assert http_json.post(url + "/x", {"a": 1})["id"] == "x"
    assert len(writes) == 2, [w[:60] for w in writes]
    assert writes[0].startswith(b"POST /v1/chat/completions ") and writes[0].endswith(b'"max_tokens":2}')
    assert writes[1].startswith(b"POST /v1/x ") and writes[1].endswith(b'{"a": 1}')


def test_the_plain_http_agent_retries_503s_reopens_dropped_connections_and_keeps_one_alive(scripted, monkeypatch):
    """agents/arithmetic_http.py, the SDK-less agent: the same retries as the SDK's clients
    above, one kept-alive connection per thread, and a 503 that does not end fails the call."""
    from actorjet.runtime import http_json
    from actorjet_agents import arithmetic_http

    waits = []
    monkeypatch.setattr(arithmetic_http.time, "sleep", waits.append)
    server, url = scripted
    server.script[:] = ["busy", "busy", "drop-after", "close"]
    for k in range(4):     # two 503s, then an answer; then a dropped connection (reopened), a closed one, a kept one
        assert arithmetic_http.chat(llm(url, f"h{k}"), "tiny", [{"role": "user", "content": "q"}], 2) == "42"
    assert server.seen == ["busy", "busy", "drop-after", "close", "ok", "ok"] and waits == [0.5, 1.0]
    assert arithmetic_http.every_model({"question": "40+02=", "answer": "42"}, llm(url, "h9")) == {"tiny": 1.0}
    assert len(set(server.ports[-3:])) == 1                        # after the close, one connection
    server.script[:] = ["busy"] * (arithmetic_http.RETRIES + 1)
    with pytest.raises(http_json.HttpError, match="503 engine restarting"):
        arithmetic_http.chat(llm(url, "h10"), "tiny", [], 2)


def test_the_plain_http_agent_backs_off_from_a_gateway_that_is_down(monkeypatch):
    """A refused connection is retried with the SDK's backoff (0.5 s doubling, at most 8 s),
    not in a burst that fails the episode before a restarting gateway is back."""
    from actorjet.runtime import http_json
    from actorjet_agents import arithmetic_http

    waits = []
    monkeypatch.setattr(arithmetic_http.time, "sleep", waits.append)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # nothing listens there once it is closed
    with pytest.raises(http_json.Unreachable):
        arithmetic_http.chat(llm(f"http://127.0.0.1:{port}/v1", "h11"), "tiny", [], 2)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
