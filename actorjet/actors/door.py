"""The outbound door: leases and results over HTTP, for nodes that accept no connections.

A joined node is a thespian convention member, and the head's actors open connections *to*
it; a laptop behind NAT or an edge box behind a firewall can only connect out.  Such a node
runs `actorjet join --outbound http://HEAD:DOOR_PORT` (actorjet/runner/outbound.py): it asks
this door for leases and posts results back, and its agents call the gateways' URLs as any
runner does.  Every call carries the cluster token.

    POST /v1/actorjet/leases   {runner_id, max_groups, behaviors: {name: version}}
                               → {leases: [...], behaviors: {name: signed payload, blob base64}, retry_s}
    POST /v1/actorjet/results  {runner_id, lease_id, results: [{episode_id, error?}]} (rewards
                               went to the stores: runner/results.py)
    POST /v1/actorjet/abandoned {runner_id, lease_ids}: which of these leases the registry
                               expired (idle or total limit) → {abandoned: {lease_id: cause}};
                               the node gives up on them, as a thespian runner does on
                               AbandonLease (it polls this while it holds leases)
    POST /v1/actorjet/hello    {runner_id}: checks the URL and the token
    GET  /v1/actorjet/status   the registry's status (at most 1 s old) and the head's last
                               errors: what `actorjet top` shows, from any machine
    POST /v1/actorjet/trials   {trial_id, job, model_seed, slots?}: run a research trial on a
                               node joined with --trials (201, or 409 when none is free)
    GET  /v1/actorjet/trials   the swarm's trial capacity and every trial (id, node, state, step,
                               exit code); GET …/trials/ID one trial with its evals and log tail; DELETE
                               …/trials/ID stops it (registry/trials.py)
    GET  /healthz

The door is a plain runner as far as the registry knows (a lease request with a runner id);
a node that vanishes simply lets its leases expire, and the registry re-queues them.
HTTP handlers hand requests to the actor through a queue drained by a short wakeup loop; the
registry's answer carries the request's tag back to the waiting handler.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from datetime import timedelta
from pathlib import Path

from aiohttp import web
from thespian.actors import WakeupMessage

from actorjet.checks import int_in, is_int
from actorjet.config import normalize
from actorjet.errors import UserError
from actorjet.registry import trials as tr
from actorjet.serving.openai_api import ApiError, error_middleware, read_json
from actorjet.serving.serve import AppServer
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.inbox import Inbox
from actorjet.signing import bearer_ok

POLL_S = 0.02
STATUS_MAX_AGE_S = 1.0
STATUS_RETRY_S = 2.0
ASK_TIMEOUT_S = 10.0
MAX_ID = 200
ABANDONED_KEEP_S = 3600.0     # how long an expired lease is remembered for its node to ask


def _check_id(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise ApiError(400, f"'{key}' must be a non-empty string of at most {MAX_ID} characters", key)
    return value


def check_lease_request(body: dict) -> tuple[str, int, dict]:
    runner_id = _check_id(body, "runner_id")
    max_groups = body.get("max_groups", 1)
    if not int_in(max_groups, 1, 256):
        raise ApiError(400, "'max_groups' must be an integer from 1 to 256", "max_groups")
    versions = body.get("behaviors", {})
    if not isinstance(versions, dict) or not all(isinstance(k, str) and is_int(v) for k, v in versions.items()):
        raise ApiError(400, "'behaviors' must map behavior names to integer versions", "behaviors")
    return f"outbound:{runner_id}", max_groups, versions


def check_lease_ids(body: dict) -> list[str]:
    _check_id(body, "runner_id")
    ids = body.get("lease_ids")
    if not isinstance(ids, list) or len(ids) > 4096 or not all(isinstance(i, str) and 0 < len(i) <= MAX_ID for i in ids):
        raise ApiError(400, f"'lease_ids' must be a list of at most 4096 lease ids (strings of at most {MAX_ID} "
                            "characters)", "lease_ids")
    return ids


def check_results(body: dict) -> proto.GroupResult:
    """An outbound node's GroupResult: each episode done (its reward is in the stores
    already) or failed with an ``error``; a reward, if sent, is not the door's business."""
    runner_id, lease_id = _check_id(body, "runner_id"), _check_id(body, "lease_id")
    results = body.get("results")
    if not isinstance(results, list) or not results:
        raise ApiError(400, "'results' must be a non-empty list", "results")
    clean = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise ApiError(400, f"results[{i}] must be an object", "results")
        episode_id = _check_id(r, "episode_id")
        error = r.get("error")
        if error is not None and not isinstance(error, str):
            raise ApiError(400, f"results[{i}].error must be a string (or absent: the episode is done)", "results")
        clean.append({"episode_id": episode_id, **({"error": error[:2000]} if error else {})})
    return proto.GroupResult(f"outbound:{runner_id}", lease_id, clean)


def check_trial(body: dict) -> tr.SubmitTrial:
    """A research controller's trial: an id that can name a directory, a valid job."""
    from actorjet.runner.trial_runs import SAFE_ID

    trial_id = body.get("trial_id")
    if not isinstance(trial_id, str) or not SAFE_ID.match(trial_id):
        raise ApiError(400, "'trial_id' must be 1-200 characters of letters, digits, '_', '.' and '-' "
                            "(it names the trial's directory on its node)", "trial_id")
    if not isinstance(body.get("job"), dict):
        raise ApiError(400, "'job' must be a job as an object (models, tasks, train)", "job")
    try:
        job = normalize(json.loads(json.dumps(body["job"])), "job")
    except UserError as e:
        raise ApiError(400, str(e), "job") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ApiError(400, f"job: not a valid job ({type(e).__name__}: {e})", "job") from None
    seed, slots = body.get("model_seed", 0), body.get("slots", 2)
    if not int_in(seed, 0, 2**31 - 1):
        raise ApiError(400, "'model_seed' must be an integer from 0 to 2**31-1", "model_seed")
    if not int_in(slots, 0, 64):
        raise ApiError(400, "'slots' must be an integer from 0 to 64 (runner slots of the trial's own head)", "slots")
    return tr.SubmitTrial(trial_id, job, seed, slots)


def last_errors(log_file: Path, n: int = 8) -> list[str]:
    """The last ERROR / CRITICAL lines of the head's actor log (crash reports name the child's path)."""
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if " ERROR " in line or " CRITICAL " in line][-n:]


def payload_to_json(payload: dict) -> dict:
    return dict(payload, blob=base64.b64encode(payload["blob"]).decode())


class Door(ManagedActor):
    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        return capabilities.get("actorjet_role") == "head"

    def on_init(self) -> None:
        self.inbox = Inbox()                      # from the HTTP handlers
        self.waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future, float]] = {}
        self.tags = itertools.count()
        self.seen: dict[str, float] = {}          # outbound runner → last request (status)
        self.status_cache: tuple | None = None                 # (registry status, when, head log errors)
        self.status_waiters: list = []                         # (loop, future, since) waiting for it
        self.status_asked = 0.0                                # when GetStatus went out (0: answered)
        self.abandoned: dict[str, tuple[str, float]] = {}      # lease id → (cause, when) the registry expired it
        self.log_file = Path(self.context.get("run_dir", ".")) / "logs" / "head" / "actors.log"
        port = int(self.args.get("port") or self.context.get("door_port") or 0)
        self.server = AppServer(self._app(), name="door", port=port)
        self.announce("", {"door": self.server.url})
        self.wakeupAfter(timedelta(seconds=POLL_S))

    # -- HTTP side (the server's thread) --------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024, middlewares=[error_middleware("door")])
        app.router.add_post("/v1/actorjet/leases", self._leases)
        app.router.add_post("/v1/actorjet/results", self._results)
        app.router.add_post("/v1/actorjet/abandoned", self._abandoned)
        app.router.add_post("/v1/actorjet/hello", self._hello)
        app.router.add_get("/v1/actorjet/status", self._status)
        app.router.add_post("/v1/actorjet/trials", self._submit_trial)
        app.router.add_get("/v1/actorjet/trials", self._trials)
        app.router.add_get("/v1/actorjet/trials/{trial_id}", self._trials)
        app.router.add_delete("/v1/actorjet/trials/{trial_id}", self._cancel_trial)
        app.router.add_get("/healthz", lambda request: web.json_response({"ok": True}))
        return app

    def _auth(self, request) -> None:
        if not bearer_ok(request.headers.get("Authorization", ""), self.context["token"]):
            raise ApiError(401, "the door needs the cluster token: 'Authorization: Bearer <token>'",
                           code="invalid_api_key", kind="authentication_error")

    async def _body(self, request) -> dict:
        self._auth(request)
        return await read_json(request)

    async def _ask(self, message) -> web.Response:
        """A trial message to the registry and its TrialAnswer back as the HTTP answer."""
        future = asyncio.get_running_loop().create_future()
        self.inbox.put((message, asyncio.get_running_loop(), future))
        try:
            answer = await asyncio.wait_for(future, ASK_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ApiError(503, "the registry did not answer (restarting?); try again", code="registry_busy") from None
        return web.json_response(answer.body, status=answer.status)

    async def _submit_trial(self, request):
        return await self._ask(check_trial(await self._body(request)))

    async def _trials(self, request):
        self._auth(request)
        return await self._ask(tr.TrialQuery(request.match_info.get("trial_id", "")))

    async def _cancel_trial(self, request):
        self._auth(request)
        return await self._ask(tr.CancelTrial(request.match_info["trial_id"]))

    async def _leases(self, request):
        runner_id, max_groups, versions = check_lease_request(await self._body(request))
        future = asyncio.get_running_loop().create_future()
        self.inbox.put((proto.LeaseRequest(runner_id, max_groups, versions), asyncio.get_running_loop(), future))
        try:
            answer = await asyncio.wait_for(future, ASK_TIMEOUT_S)
        except asyncio.TimeoutError:
            return web.json_response({"leases": [], "behaviors": {}, "retry_s": 1.0, "reason": "registry busy"})
        if isinstance(answer, proto.NoWork):
            return web.json_response({"leases": [], "behaviors": {}, "retry_s": answer.retry_s,
                                      "reason": answer.reason})
        return web.json_response({"leases": answer.leases, "retry_s": 0,
                                  "behaviors": {k: payload_to_json(p) for k, p in answer.behaviors.items()}})

    async def _abandoned(self, request):
        """Read from the server's thread: the actor only adds and removes whole entries."""
        ids = check_lease_ids(await self._body(request))
        found = {i: entry[0] for i in ids if (entry := self.abandoned.get(i))}   # (one lookup: the actor prunes)
        return web.json_response({"abandoned": found})

    async def _hello(self, request):
        """An outbound node checks the URL and its token before it starts."""
        _check_id(await self._body(request), "runner_id")
        return web.json_response({"ok": True})

    async def _status(self, request):
        """One registry status per second at most, however many watchers poll: watching must
        never slow training."""
        if not bearer_ok(request.headers.get("Authorization"), self.context["token"]):
            raise ApiError(401, "status needs the cluster token: 'Authorization: Bearer <token>'",
                           code="invalid_api_key", kind="authentication_error")
        future = asyncio.get_running_loop().create_future()
        self.inbox.put(("status", asyncio.get_running_loop(), future))
        try:
            data, at, errors = await asyncio.wait_for(future, ASK_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ApiError(503, "the registry did not answer (restarting?)", code="registry_busy") from None
        return web.json_response({"status": data, "age_s": round(time.time() - at, 2), "errors": errors},
                                 dumps=lambda x: json.dumps(x, default=str))

    async def _results(self, request):
        self.inbox.put((check_results(await self._body(request)), None, None))
        return web.json_response({"ok": True})

    # -- actor side ------------------------------------------------------------------------
    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        now, batch = time.monotonic(), []
        for message, loop, future in self.inbox.drain():
            if message == "status":
                self._status_wanted(loop, future)
                continue
            if isinstance(message, (proto.LeaseRequest, tr.SubmitTrial, tr.TrialQuery, tr.CancelTrial)):
                message.tag = str(next(self.tags))
                self.waiting[message.tag] = (loop, future, now)
            if isinstance(message, proto.LeaseRequest):
                self.seen[message.runner_id] = time.time()
            if isinstance(message, (tr.SubmitTrial, tr.TrialQuery, tr.CancelTrial)):
                if self.registry is not None:
                    self.send(self.registry, message)      # not a desk's message: never in a Batch
                continue
            batch.append(message)
        if batch and self.registry is not None:         # one frame for all of them (proto.Batch)
            self.send(self.registry, batch[0] if len(batch) == 1 else proto.Batch(batch))
        for tag, (_, _, at) in list(self.waiting.items()):
            if now - at > ASK_TIMEOUT_S:
                del self.waiting[tag]         # the handler answered "registry busy" already
        wall = time.time()
        self.status_waiters = [w for w in self.status_waiters if wall - w[2] < ASK_TIMEOUT_S]   # handlers gave up
        self.wakeupAfter(timedelta(seconds=POLL_S))

    def _answer(self, msg) -> None:
        loop, future, _ = self.waiting.pop(msg.tag, (None, None, None))
        if loop is not None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(msg))

    def receiveMsg_Batch(self, msg: proto.Batch, sender):
        for inner in msg.messages if isinstance(msg.messages, list) else []:
            if isinstance(inner, (proto.Leases, proto.NoWork, proto.AbandonLease)):
                self.receiveMessage(inner, sender)

    def receiveMsg_Leases(self, msg: proto.Leases, sender):
        self._answer(msg)

    def receiveMsg_NoWork(self, msg: proto.NoWork, sender):
        self._answer(msg)

    def receiveMsg_TrialAnswer(self, msg: tr.TrialAnswer, sender):
        self._answer(msg)

    def receiveMsg_AbandonLease(self, msg: proto.AbandonLease, sender):
        """The registry expired a lease an outbound node holds (it sent the request through
        this door): keep the cause until the node asks (``/v1/actorjet/abandoned``)."""
        now = time.time()
        self.abandoned[msg.lease_id] = (str(msg.cause), now)
        for lease_id, (_, at) in list(self.abandoned.items()):
            if now - at > ABANDONED_KEEP_S:
                del self.abandoned[lease_id]

    def _status_wanted(self, loop, future) -> None:
        """Answer from the cache if it is fresh; otherwise wait for the registry, asking it
        again if no answer came within STATUS_RETRY_S (a registry that restarted, a reply
        that was lost), so one lost reply can never wedge every later watcher."""
        now = time.time()
        if self.status_cache is not None and now - self.status_cache[1] < STATUS_MAX_AGE_S:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(self.status_cache))
            return
        self.status_waiters.append((loop, future, now))
        if self.registry is not None and now - self.status_asked > STATUS_RETRY_S:
            self.status_asked = now
            self.send(self.registry, m.GetStatus())

    def receiveMsg_Status(self, msg: m.Status, sender):
        # the log's last errors are read with the status (once a second), not per watcher
        self.status_cache, self.status_asked = (msg.data, time.time(), last_errors(self.log_file)), 0.0
        waiters, self.status_waiters = self.status_waiters, []
        for loop, future, _ in waiters:
            loop.call_soon_threadsafe(lambda f=future: f.done() or f.set_result(self.status_cache))

    def on_stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop(self.stop_grace_s)

    def info(self) -> dict:
        return {"path": self.path, "url": self.server.url if getattr(self, "server", None) else None,
                "outbound_runners": {k: round(time.time() - t, 1) for k, t in getattr(self, "seen", {}).items()}}
