"""The OpenAI-compatible gateway of one model (aiohttp).

It turns chat messages into token ids with the model's chat template, asks the engine
for completions, records every call (ids, logprobs, version, role) under the episode
its API key belongs to, and answers in OpenAI's format — streaming included, as a replay
of the recorded answer, so the tokens a client sees are exactly the ones trained on.

Every call is written to the model's episode store (store/episode_store.py) before its
answer leaves: the calls of one turn of the event loop in one transaction, in a writer
thread.  The rewards of finished episodes arrive here too, with the episode keys that prove
them, and complete the model's GRPO groups; the learner pulls batches from the same store.

Endpoints:  POST /v1/chat/completions, POST /v1/completions, POST /v1/responses
(serving/responses_api.py), POST /v1/messages (serving/messages_api.py), GET /v1/models,
GET /healthz;
POST /v1/actorjet/results (finished episodes, from runners); client mode
POST /v1/actorjet/episodes[/{id}/end|/abort].
"""
from __future__ import annotations

import asyncio
import json
from array import array
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from aiohttp import web

from actorjet import signing
from actorjet import disk
from actorjet.serving import openai_api as api
from actorjet.serving import messages_api, tool_calls
from actorjet.serving.batching_engine import GenRequest, GenResult, RequestFailed
from actorjet.serving.episode_routes import EpisodeRoutes
from actorjet.serving.openai_api import ApiError, EngineUnavailable
from actorjet.store.episode_store import EpisodeStore
from actorjet.store.records import CallRecord
from actorjet.serving.render import Renderer
from actorjet.serving.responses_api import ResponsesRoutes
from actorjet.serving.tool_choice import closing, parse_tool_choice, tool_choice_prefix
from actorjet.signing import bearer_ok

Backend = Callable[[GenRequest], Awaitable[list[GenResult]]]


@dataclass
class Answer:
    """One sampled answer: what the engine returned, and its text and tool calls as parsed."""
    result: GenResult
    content: str | None
    calls: list[dict]
    finish_reason: str          # stop | length | tool_calls


class GatewayApp:
    def __init__(self, model: str, tokenizer, backend: Backend, secret: str, max_len: int,
                 store: EpisodeStore | None = None, default_max_tokens: int = 256,
                 outbox: Callable[[dict], None] | None = None, directory: Callable[[], dict] | None = None,
                 record: bool = True, peers: Callable[[], dict] | None = None, adapter: str = "",
                 tool_parser: str = ""):
        self.model, self.tokenizer, self.backend = model, tokenizer, backend
        self.secret, self.max_len = secret, max_len
        self.store = store or EpisodeStore()
        self.writer = ThreadPoolExecutor(1, thread_name_prefix=f"store.{model}")
        self._next_flush: asyncio.Future | None = None      # the write the calls added now wait for
        self._writing = False
        self.peers = peers or (lambda: {})                  # other trainable gateways (client-mode ends)
        self.default_max_tokens = default_max_tokens
        self.outbox = outbox or (lambda event: None)       # client-mode episode events
        self.directory = directory or (lambda: {})          # model name → gateway base URL
        self.weight_version = 0
        self.requests = 0
        self.record = record        # a frozen model (nothing trains on its calls) keeps no records
        self.adapter = adapter      # base = "other": this model is that engine's adapter of this name
        self.tool_parser = tool_parser   # the model entry's tool_parser ('': read from the chat template)
        self.renderer = Renderer(tokenizer)                 # chat messages → ids, O(new tokens) per call
        self.active: set[str] = set()        # episodes seen since the actor last reported them (idle limit)
        self.calling: dict[str, int] = {}    # episodes with a call in the engine now (active too)
        self.disk_full = ""                  # why the last store write failed for want of space

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024,
                              middlewares=[api.error_middleware(f"gateway {self.model}", self._translate,
                                                                {"/v1/messages": messages_api.error_body})])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", ResponsesRoutes(self).create)
        app.router.add_post("/v1/messages", messages_api.MessagesRoutes(self).create)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model_info)
        app.router.add_get("/healthz", self.health)
        episodes = EpisodeRoutes(self)
        app.router.add_post("/v1/actorjet/episodes", episodes.open_episode)
        app.router.add_post("/v1/actorjet/episodes/{episode}/{verb}", episodes.end_episode)
        app.router.add_post("/v1/actorjet/results", episodes.results)
        return app

    def _translate(self, e: Exception) -> ApiError | None:
        if isinstance(e, EngineUnavailable):
            return ApiError(503, f"the engine is not available right now ({e}); retry shortly",
                            kind="server_error", code="engine_unavailable", headers={"Retry-After": "1"})
        if disk.is_full(e):          # nothing was recorded, so nothing is answered (actorjet/disk.py)
            self.disk_full = disk.describe(e, self.store.path)
            return ApiError(503, f"the disk of this model's episode store is full ({self.disk_full}): nothing "
                            "was recorded; retry once space is freed", kind="server_error", code="disk_full",
                            headers={"Retry-After": str(int(disk.RETRY_S))})
        return None

    async def write(self, fn, *args):
        """A store write in the writer thread (one at a time, after the calls it may follow).
        A full disk raises (a 503 by ``_translate``); a write that succeeds clears it."""
        result = await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)
        self.disk_full = ""
        return result

    # -- helpers ------------------------------------------------------------------------
    def _episode(self, request) -> str:
        auth = request.headers.get("Authorization", "")      # (x-api-key: the anthropic SDK's way)
        key = auth[7:].strip() if auth.startswith("Bearer ") else request.headers.get("x-api-key", "").strip()
        if not key:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <episode key>' (or x-api-key)",
                           code="invalid_api_key", kind="authentication_error")
        episode_id = signing.verify_key(self.secret, key)
        if episode_id is None:
            raise ApiError(401, "invalid API key (not an ActorJet episode key)", code="invalid_api_key",
                           kind="authentication_error")
        if self.store.is_closed(episode_id):
            raise ApiError(409, f"episode {episode_id} is closed ({self.store.closed_cause(episode_id)}); "
                           "open a new episode", code="episode_closed")
        self.active.add(episode_id)
        return episode_id

    def _cluster(self, request) -> None:
        auth = request.headers.get("Authorization", "")
        if not bearer_ok(auth, self.secret):
            raise ApiError(403, "this endpoint needs the cluster token", kind="permission_error")

    def _role(self, request) -> str:
        role = request.headers.get("X-ActorJet-Role", "default")
        if not role or len(role) > 100:
            raise ApiError(400, "the X-ActorJet-Role header must be 1 to 100 characters", "X-ActorJet-Role")
        return role

    def _check_model(self, body: dict) -> None:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required", "model")
        if name != self.model:
            raise ApiError(404, f"the model {name!r} does not exist here; this gateway serves "
                           f"{self.model!r}", "model", code="model_not_found")

    def _render(self, episode_id: str, role: str, messages: list, tools: list | None):
        """The prompt's token ids (int32), tokenizing only what this conversation added since
        its last call (serving/render.py)."""
        try:
            return self.renderer.render((episode_id, role), messages, tools)
        except Exception as e:  # noqa: BLE001 - a template rejects what the model cannot take
            raise ApiError(400, f"the chat template rejected these messages: {e}", "messages") from None

    def _budget(self, prompt_ids: list[int], s: api.Sampling) -> int:
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty (0 tokens after the chat template)", "messages")
        room = self.max_len - len(prompt_ids)
        if room <= 0:
            raise ApiError(400, f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                           f"{self.max_len} tokens. Shorten the messages.", "messages",
                           code="context_length_exceeded")
        if s.max_tokens is not None and s.max_tokens > room and s.cap_to_context:
            return room
        if s.max_tokens is not None and s.max_tokens > room:
            raise ApiError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({s.max_tokens}) exceeds "
                           f"the context of {self.max_len} tokens", "max_tokens",
                           code="context_length_exceeded")
        return s.max_tokens or min(self.default_max_tokens, room)

    async def _generate(self, prompt_ids, s: api.Sampling, max_tokens: int, episode_id: str,
                        conversation: str = "") -> list[GenResult]:
        """``conversation`` (episode/role) lets the engine keep its KV cache for the next call.
        While the engine works on it, the episode counts as active (its idle limit)."""
        self.requests += 1
        req = GenRequest(prompt_ids, max_tokens, s.temperature, s.top_p, s.stop, s.seed, s.n, s.top_logprobs,
                         self.adapter, conversation)
        self.calling[episode_id] = self.calling.get(episode_id, 0) + 1
        try:
            results = await self.backend(req)
        except RequestFailed as e:     # failed alone while the engine works: this request's fault
            raise ApiError(400, f"the engine could not serve this request: {e}", code="invalid_request") from None
        finally:
            self.calling[episode_id] -= 1
            if not self.calling[episode_id]:
                del self.calling[episode_id]
        if results:
            self.weight_version = max(r.weight_version for r in results)
        return results

    def _text(self, result: GenResult, stop: list[str], forced: list[int] = ()) -> str:
        """The answer as text: with a forced tool-call opening (tool_choice), that opening too."""
        ids = list(forced) + list(result.completion_ids) if forced else result.completion_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((text.find(x) for x in stop if x in text), default=-1)
        return text[:cut] if cut >= 0 else text

    async def _record(self, episode_id, role, prompt_ids, results, s, messages, tools) -> None:
        """Record the call, and return once it is on disk: a call the agent saw is never lost."""
        if not self.record:
            return
        base = self.store.next_index(episode_id)
        params = {"temperature": s.temperature, "top_p": s.top_p, "n": s.n, "stop": s.stop, "seed": s.seed}
        self.store.add([CallRecord(episode_id, self.model, role, base, k, prompt_ids,
                                   r.completion_ids, r.logprobs, r.weight_version, s.temperature,
                                   messages, tools, params, r.finish_reason)
                        for k, r in enumerate(results)])
        await self._flushed()

    def _flushed(self) -> asyncio.Future:
        """One write per turn of the event loop (group commit): every call added before the
        next write starts waits for that write."""
        loop = asyncio.get_running_loop()
        if self._next_flush is None:
            self._next_flush = loop.create_future()
            loop.call_soon(self._start_flush)
        return asyncio.shield(self._next_flush)

    def _start_flush(self) -> None:
        if self._writing or self._next_flush is None:
            return             # the write under way starts this one when it is done
        done, self._next_flush = self._next_flush, None
        self._writing = True

        def finished(write) -> None:
            self._writing = False
            if not done.done():
                if write.exception() is not None:
                    done.set_exception(write.exception())
                else:
                    self.disk_full = ""
                    done.set_result(None)
            if self._next_flush is not None:
                self._start_flush()

        asyncio.get_running_loop().run_in_executor(self.writer, self.store.flush).add_done_callback(
            lambda f: f.get_loop().call_soon_threadsafe(finished, f))

    # -- one call, whatever the API ----------------------------------------------------------
    async def answer(self, request, episode_id: str, messages: list, tools: list | None, s: api.Sampling,
                     tool_choice=None) -> tuple[list[int], list[Answer]]:
        """Render, generate, record (before anything is answered), and parse tool calls: the
        same for the chat, Responses and Messages APIs, so their calls merge alike.  ``messages``
        and ``tools`` in chat-completions form; ``tool_choice``: serving/tool_choice.py."""
        role = self._role(request)
        if self.record:
            self.store.call_started(episode_id)       # the step timeline's "first call"
        forced = tool_choice_prefix(self.tokenizer, tools, tool_choice, self.tool_parser)
        prompt_ids = self._render(episode_id, role, messages, tools)
        if forced:
            prompt_ids = prompt_ids + array("i", forced)
        max_tokens = self._budget(prompt_ids, s)
        ends = closing(self.tokenizer, tool_choice, self.tool_parser) if forced else []
        sampled = replace(s, stop=s.stop + ends) if ends else s    # the request's own stops cut the text
        results = await self._generate(prompt_ids, sampled, max_tokens, episode_id, f"{episode_id}/{role}")
        await self._record(episode_id, role, prompt_ids, results, sampled, messages, tools)
        answers = []
        for r in results:
            content, calls = self._text(r, s.stop, forced), []
            if tools and tool_choice != "none":
                content, calls = tool_calls.split_tool_calls(content, tools, self.tokenizer, self.tool_parser)
            answers.append(Answer(r, content, calls, "tool_calls" if calls else r.finish_reason))
        return prompt_ids, answers

    # -- OpenAI endpoints ----------------------------------------------------------------
    async def chat(self, request):
        episode_id = self._episode(request)
        body = await api.read_json(request)
        self._check_model(body)
        messages, tools = api.parse_messages(body), api.parse_tools(body)
        s = api.parse_sampling(body)
        choice = parse_tool_choice(body.get("tool_choice"), tools)
        prompt_ids, answers = await self.answer(request, episode_id, messages, tools, s, choice)
        choices = []
        for k, a in enumerate(answers):
            message = {"role": "assistant", "content": a.content}
            if a.calls:
                message["tool_calls"] = a.calls
            choices.append({"index": k, "message": message, "finish_reason": a.finish_reason,
                            "logprobs": self._logprobs(a.result, a.content or "") if s.logprobs else None})
        results = [a.result for a in answers]
        n_out = sum(len(r.completion_ids) for r in results)
        if s.stream:
            return await self._stream(request, choices, results, len(prompt_ids), n_out, s)
        return web.json_response(api.chat_response(self.model, choices, len(prompt_ids), n_out))

    def _logprobs(self, r: GenResult, content: str) -> dict:
        """OpenAI's shape: one entry per token of the answer, whose texts spell ``content``
        (tokens decoded incrementally, so multi-byte characters split across tokens still add
        up; tokens past a stop string or special ones contribute nothing and are left out),
        each with its ``top_logprobs`` alternatives when asked for."""
        entries, spelled = [], ""
        for i, (t, lp) in enumerate(zip(r.completion_ids, r.logprobs)):
            if len(spelled) >= len(content):
                break
            text = self.tokenizer.decode(r.completion_ids[:i + 1], skip_special_tokens=True)
            piece = text[len(spelled):len(content)] if text.startswith(spelled) else ""
            if not piece:
                continue
            spelled += piece
            top = r.top_logprobs[i] if r.top_logprobs else []
            entries.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()),
                            "top_logprobs": [{"token": (tt := self.tokenizer.decode([tid])), "logprob": tlp,
                                              "bytes": list(tt.encode())} for tid, tlp in top]})
        return {"content": entries}

    async def _stream(self, request, choices, results, n_prompt, n_out, s):
        """Replay the recorded answer as server-sent events, one token per chunk."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid = api.completion_id()

        async def send(obj):
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        for choice, r in zip(choices, results):
            k, msg = choice["index"], choice["message"]
            await send(api.chunk(cid, self.model, k, {"role": "assistant", "content": ""}))
            text, sent = msg["content"] or "", 0
            for i in range(1, len(r.completion_ids) + 1):
                upto = self.tokenizer.decode(r.completion_ids[:i], skip_special_tokens=True)[:len(text)]
                if len(upto) > sent and text.startswith(upto):
                    await send(api.chunk(cid, self.model, k, {"content": upto[sent:]}))
                    sent = len(upto)
            if sent < len(text):
                await send(api.chunk(cid, self.model, k, {"content": text[sent:]}))
            if msg.get("tool_calls"):
                calls = [dict(c, index=j) for j, c in enumerate(msg["tool_calls"])]
                await send(api.chunk(cid, self.model, k, {"tool_calls": calls}))
            await send(api.chunk(cid, self.model, k, {}, finish_reason=choice["finish_reason"]))
        if s.include_usage:
            await send(api.chunk(cid, self.model, 0, {}, usage={
                "prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def completions(self, request):
        episode_id = self._episode(request)
        body = await api.read_json(request)
        self._check_model(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "'prompt' must be a non-empty string", "prompt")
        s = api.parse_sampling(body)
        if s.stream:
            raise ApiError(400, "stream is supported on /v1/chat/completions only", "stream")
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        results = await self._generate(prompt_ids, s, self._budget(prompt_ids, s), episode_id)
        await self._record(episode_id, self._role(request), prompt_ids, results,
                           s, [{"role": "prompt", "content": prompt}], None)
        n_out = sum(len(r.completion_ids) for r in results)
        return web.json_response({
            "id": api.completion_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": k, "text": self._text(r, s.stop), "finish_reason": r.finish_reason,
                         "logprobs": None} for k, r in enumerate(results)],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                      "total_tokens": len(prompt_ids) + n_out}})

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "actorjet"}]})

    async def model_info(self, request):
        name = request.match_info["model"]
        if name != self.model:
            raise ApiError(404, f"the model {name!r} does not exist here; this gateway serves {self.model!r}",
                           "model", code="model_not_found")
        return web.json_response({"id": self.model, "object": "model", "created": 0, "owned_by": "actorjet"})

    async def health(self, request):
        return web.json_response({"ok": True, "model": self.model, "weight_version": self.weight_version,
                                  "open_episodes": self.store.open_episodes()})

def local_backend(engine) -> Backend:
    """Call an in-process TransformersEngine (tests, benchmarks, single-process use)."""
    async def generate(req: GenRequest) -> list[GenResult]:
        return await asyncio.wrap_future(engine.submit(req))
    return generate
