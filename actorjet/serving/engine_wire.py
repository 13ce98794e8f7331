"""Everything that crosses the wire to an engine, both ends of it, in one place.

An engine replica has two endpoints; the engine actor (actors/engine.py) only starts them:

* **its HTTP app** (``engine_app``): ``POST /generate`` takes a list of requests (the gateway
  sends every request that arrived in one turn of its event loop together, so HTTP and JSON
  are paid per batch rather than per LLM call) and answers one entry per request: its
  ``results``, or an ``error`` (with ``request_error``: that request's own fault, a 400 at the
  gateway; without: the engine's, a 503 and a retry elsewhere).  ``GET /healthz`` says the
  weight versions it serves.  Requests travel as ``wire_request`` writes them (the prompt as
  base64 of int32) and are read back, checked, by ``read_request``; answers are read by
  ``read_answer`` on the gateway's side (serving/engine_client.py);
* **its weights receiver** (``Receiver``): a learner on another node ``push``es each weight
  version file to it (``PUT /weights/FOLDER/vNNNNNN.safetensors``), before telling the
  engine (``LoadWeights``, a control message) to load it.  Its own small threaded server, not
  a route of the app: aiohttp hands a body over in pieces that must be copied again, which
  reached a third of the link's speed, this two thirds (bench/weightsync.py).  ``deliver`` is
  the learner's side: it pushes where needed and says where each replica finds the file.

Every endpoint needs the cluster token; anything malformed is a 4xx that says why.
"""
from __future__ import annotations

import asyncio
import http.client
import base64
import binascii
import json
import mmap
import os
import shutil
import socketserver
import threading
import time
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from actorjet.runtime.endpoints import advertise_host
from actorjet.runtime.logs import log
from actorjet.serving.batching_engine import GenRequest, GenResult, RequestFailed
from actorjet.serving.openai_api import ApiError, EngineUnavailable
from actorjet.serving.weights import FOLDER, NAME, PARTIAL
from actorjet.signing import bearer_ok


# -- requests and answers -------------------------------------------------------------------
def wire_request(req: GenRequest) -> dict:
    """A request as JSON, its prompt as base64 of int32 (a 32k-token prompt as a JSON list of
    numbers took ~2 ms to write and more to read, on every call of a long episode)."""
    body = dict(req.__dict__)
    ids = body["prompt_ids"]
    body["prompt_ids"] = base64.b64encode((ids if isinstance(ids, array) else array("i", ids)).tobytes()).decode()
    return body


def read_answer(answer: dict) -> list[GenResult] | Exception:
    """One entry of /generate's ``answers``: the request's results, or the exception it is at
    the gateway (ApiError 400: the request's own fault; EngineUnavailable: the engine's)."""
    if "error" in answer and answer.get("request_error"):
        return ApiError(400, f"the engine could not serve this request: {answer['error']}", code="invalid_request")
    if "error" in answer:
        return EngineUnavailable(f"the engine failed: {answer['error']}")
    return [GenResult(**r) for r in answer["results"]]


def all_done(futures: list) -> asyncio.Future:
    """An awaitable that resolves once every one of the engine's futures is done.  Waking the
    event loop once per call rather than once per request (asyncio.wrap_future does the
    latter, each through the loop's self-pipe) was a quarter of the engine's HTTP-side CPU."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = [len(futures)]
    lock = threading.Lock()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def one_done(_future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last and not loop.is_closed():
            loop.call_soon_threadsafe(finish)

    if not futures:
        finish()
    for future in futures:
        future.add_done_callback(one_done)
    return done


def read_request(body: dict) -> GenRequest:
    """``wire_request`` undone, and checked: the prompt comes as base64 of int32."""
    ids = body.pop("prompt_ids")
    if isinstance(ids, str):
        raw = base64.b64decode(ids, validate=True)
        if len(raw) % 4:
            raise ValueError("prompt_ids: not whole int32 values")
        ids = array("i", raw).tolist()
    if not isinstance(body.get("cache_key", ""), str):
        raise ValueError("cache_key: a string")
    return GenRequest(prompt_ids=ids, **body)


def engine_app(engine, token: str | None = None) -> web.Application:
    """``token``: the cluster token every caller must send (the endpoint listens on the node's
    network address); None only for in-process tests."""
    async def generate(request):
        if token is not None and not bearer_ok(request.headers.get("Authorization"), token):
            return web.json_response({"error": {"message": "the engine needs the cluster token"}}, status=401)
        try:
            body = json.loads(await request.read())
            reqs = [read_request(r) for r in body["requests"]]
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, binascii.Error) as e:
            return web.json_response({"error": {"message": f"malformed generate request: {e}"}}, status=400)
        futures = [engine.submit(r) for r in reqs]
        await all_done(futures)
        answers = []
        for outcome in [f.exception() or f.result() for f in futures]:
            if isinstance(outcome, RequestFailed):      # this request's own fault: a 400 at the gateway
                answers.append({"error": str(outcome), "request_error": True})
            elif isinstance(outcome, BaseException):
                answers.append({"error": f"{type(outcome).__name__}: {outcome}"})
            else:
                answers.append({"results": [r.__dict__ for r in outcome]})
        return web.json_response({"answers": answers})

    async def health(request):
        return web.json_response({"ok": True, "weight_version": engine.weight_version, "versions": engine.versions})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/generate", generate)
    app.router.add_get("/healthz", health)
    return app


BUCKET = 16 << 20       # the most bytes the receiver reads into its file at once


# -- the weights endpoint ------------------------------------------------------------------
def push(path: str | Path, engine_url: str, token: str, folder: str, timeout_s: float = 300.0) -> str:
    """Stream the version file at ``path`` to an engine on another node (``PUT
    /weights/FOLDER/NAME``) straight from the page cache (``sendfile``); returns the path the
    engine stored it under on its own node.  The engine writes it under ``*.partial`` and
    renames it when every byte is there, so an interrupted push leaves nothing it would load."""
    path, url = Path(path), urlsplit(engine_url)
    conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(url.hostname, url.port, timeout=timeout_s)
    try:
        conn.putrequest("PUT", f"/weights/{folder}/{path.name}")
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Length", str(path.stat().st_size))
        conn.endheaders()
        try:
            with open(path, "rb") as body:
                conn.sock.sendfile(body)       # from the page cache to the socket, no copy in Python
        except (BrokenPipeError, ConnectionResetError):
            pass                               # refused before the body was read: its answer says why
        reply = conn.getresponse()
        data = json.loads(reply.read() or b"{}")
    finally:
        conn.close()
    if reply.status != 200:
        raise OSError(f"the engine refused weights {path.name}: {reply.status} {data}")
    return data["path"]


def deliver(engines: dict[str, tuple], path: Path, version: int, token: str, folder: str,
            model: str) -> tuple[list[tuple], float | None]:
    """Where each engine replica (``{name: (address, weights receiver URL or None)}``) should
    load weight version ``version`` from: ``[(address, file path on its node)]``, and the
    seconds the pushes took (None: nothing pushed).  An engine on another node cannot read
    this node's files, so the file is pushed to it first (``push``).  A push that fails is
    logged and that replica left out: it keeps serving what it has, and the next version
    tries again."""
    targets, total = [], None
    for name, (address, weights_url) in engines.items():
        target = str(path)
        if weights_url and urlsplit(weights_url).hostname != advertise_host():
            t0 = time.perf_counter()
            try:
                target = push(path, weights_url, token, folder)
            except (OSError, ValueError, KeyError) as e:
                log.warning("%s: weights v%d could not be pushed to %s at %s: %s", model, version, name, weights_url, e)
                continue
            seconds = time.perf_counter() - t0
            total = (total or 0.0) + seconds
            log.info("%s: pushed v%d (%.1f MB) to %s at %s in %.3f s", model, version,
                     Path(path).stat().st_size / 1e6, name, weights_url, seconds)
        targets.append((address, target))
    return targets, total


class PushRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Receiver:
    """The engine's side of ``push``: a small threaded HTTP server of its own (``PUT
    /weights/FOLDER/vNNNNNN.safetensors``, cluster token required).  The body is read straight
    into a memory map of the file (one copy, from the socket into the page cache), recycling the
    folder's file of three versions back as the learner does, and renamed when every byte is
    there.  Its own server because aiohttp hands a body over in pieces that must be copied
    again: that reached a third of the link's speed, this two thirds (bench/weightsync.py)."""

    def __init__(self, root: Path, token: str | None, host: str = "127.0.0.1", port: int = 0):
        self.root, self.token = Path(root), token
        self.server = _Server((host, port), _PushHandler)
        self.server.receiver = self
        self.port = self.server.server_address[1]

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.5)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def store(self, handler) -> dict:
        from actorjet.signing import bearer_ok

        if self.token is not None and not bearer_ok(handler.headers.get("Authorization"), self.token):
            raise PushRefused(401, "a weight push needs the cluster token")
        parts = handler.path.split("/")
        if len(parts) != 4 or parts[1] != "weights" or not FOLDER.match(parts[2]) or not NAME.match(parts[3]):
            raise PushRefused(400, f"not a weight version file: {handler.path[:200]}")
        try:
            size = int(handler.headers.get("Content-Length", ""))
        except ValueError:
            raise PushRefused(400, "a weight push needs a Content-Length") from None
        if size <= 0:
            raise PushRefused(400, "a weight version file is never empty")
        target = self.root / parts[2] / parts[3]
        target.parent.mkdir(parents=True, exist_ok=True)
        if size > shutil.disk_usage(target.parent).free:
            raise PushRefused(507, f"{target.name}: {size} bytes do not fit on this node's disk")
        partial = target.with_name(target.name + PARTIAL)
        older = sorted(p for p in target.parent.glob("v*.safetensors") if p.name < target.name)
        if len(older) >= 3 and older[0].stat().st_size == size:
            os.replace(older[0], partial)              # its pages are reused: no fresh allocation
        done = 0
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, size)
                with mmap.mmap(fd, size) as mm, memoryview(mm) as view:
                    while done < size:
                        n = handler.rfile.readinto(view[done:min(size, done + BUCKET)])
                        if not n:
                            break
                        done += n
            finally:
                os.close(fd)
        except ConnectionError:
            pass                                       # the learner died mid-push: judged below
        except OSError as e:                           # a full disk, or a size no file can have
            partial.unlink(missing_ok=True)
            raise PushRefused(507, f"cannot store {target.name} ({size} bytes): {e.strerror or e}") from None
        except BaseException:
            partial.unlink(missing_ok=True)            # nothing half-written stays
            raise
        if done != size:
            partial.unlink(missing_ok=True)
            raise PushRefused(400, f"{target.name}: {done} of {size} bytes arrived")
        os.replace(partial, target)
        for old in sorted(target.parent.glob("v*.safetensors"))[:-3]:     # keep the last three
            old.unlink(missing_ok=True)
        return {"path": str(target), "bytes": done}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """Without HTTPServer's reverse DNS lookup of its own address (``getfqdn``): on a host
        with no resolver it took seconds, and the engine announced itself that much later."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _PushHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120                       # a sender that stops sending is dropped

    def do_PUT(self):
        try:
            status, body = 200, self.server.receiver.store(self)
        except PushRefused as e:
            status, body = e.status, {"error": {"message": str(e)}}
            self.close_connection = True
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass
