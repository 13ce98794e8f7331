"""The OpenAI wire format: validating requests, shaping responses and errors.

Kept apart from the HTTP server so the rules are plain functions: a client mistake is an
``ApiError`` with OpenAI's JSON error shape and a 4xx status, never a 500.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from dataclasses import dataclass, field

from aiohttp import web

from actorjet.checks import int_in, number_in
from actorjet.runtime.logs import log
from actorjet.serving import tool_calls


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def error_middleware(service: str, translate=lambda e: None, shapes: dict | None = None):
    """Every error of an HTTP service as OpenAI-shaped JSON with the right status, whatever
    went wrong: an ApiError as it says, aiohttp's own (404, 405, 413) with their status, and
    anything else — a bug of ours — as a logged 500.  ``translate`` turns a service's own
    exceptions into ApiErrors (the gateway's EngineUnavailable → a retryable 503);
    ``shapes`` maps a path to another API's error body (Anthropic's on /v1/messages)."""
    @web.middleware
    async def errors(request, handler):
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as e:  # noqa: BLE001 - sorted out below
            err = e if isinstance(e, ApiError) else translate(e)
            if err is None and isinstance(e, web.HTTPException):
                if e.status < 400:
                    raise
                err = ApiError(e.status, e.reason or "request failed", code=str(e.status))
            if err is None:
                log.exception("%s: %s %s failed", service, request.method, request.path)
                err = ApiError(500, f"internal error ({type(e).__name__}); it is logged", kind="server_error",
                               code="internal_error")
            shape = (shapes or {}).get(request.path)
            return web.json_response(shape(err) if shape else err.body(), status=err.status, headers=err.headers)
    return errors



class EngineUnavailable(Exception):
    """The engine (or a peer gateway) cannot answer right now (restarting): a retryable 503."""


async def read_json(request: web.Request) -> dict:
    """A request's body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body

@dataclass
class Sampling:
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    include_usage: bool = False
    cap_to_context: bool = False     # max_tokens is a cap: cut to the room the prompt leaves (Messages API)


MIN_TEMPERATURE = 1e-3     # below this, softmax(logits / t) overflows: sampled as greedy (t = 0)


def _number(body: dict, name: str, default, lo, hi, integer=False):
    value = body.get(name, default)
    if value is None:
        return default
    if not (int_in(value, lo, hi) if integer else number_in(value, lo, hi)):
        kind = "an integer" if integer else "a number"
        raise ApiError(400, f"'{name}' must be {kind} between {lo} and {hi}, got {value!r}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {value!r}", name)
    return bool(value)


def parse_sampling(body: dict, max_n: int = 16) -> Sampling:
    s = Sampling()
    s.n = _number(body, "n", 1, 1, max_n, integer=True)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        s.max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", None, 1, 1_000_000, integer=True)
    s.temperature = float(_number(body, "temperature", 1.0, 0.0, 2.0))
    if s.temperature < MIN_TEMPERATURE:
        s.temperature = 0.0
    s.top_p = float(_number(body, "top_p", 1.0, 0.0, 1.0))
    if s.top_p == 0.0:
        raise ApiError(400, "'top_p' must be greater than 0", "top_p")
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(x, str) and 0 < len(x) <= 200 for x in stop):
            raise ApiError(400, "'stop' must be a non-empty string or a list of up to 4 of them", "stop")
        s.stop = stop
    if body.get("seed") is not None:
        s.seed = _number(body, "seed", None, -(2 ** 63), 2 ** 63 - 1, integer=True)
    s.stream = _flag(body, "stream")
    s.logprobs = _flag(body, "logprobs")
    if body.get("top_logprobs") is not None:
        s.top_logprobs = _number(body, "top_logprobs", 0, 0, 20, integer=True)
        if s.top_logprobs and not s.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    s.include_usage = _flag(opts or {}, "include_usage")
    return s


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, f"messages[{i}] needs a role of system, developer, user, assistant or tool",
                           f"messages[{i}].role")
        content = msg.get("content")
        if isinstance(content, list):      # content parts: keep the text ones
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                raise ApiError(400, f"messages[{i}].content: a text part needs a string 'text'", f"messages[{i}].content")
            msg["content"] = "".join(texts)
        elif content is None and not msg.get("tool_calls"):
            if msg["role"] != "assistant":
                raise ApiError(400, f"messages[{i}].content is missing", f"messages[{i}].content")
        elif content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
    return messages


def parse_tools(body: dict) -> list | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                              and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str)
                                              and t["function"]["name"] for t in tools):
        raise ApiError(400, "'tools' must be an array of {type: 'function', function: {name, ...}}", "tools")
    for i, t in enumerate(tools):      # the gateway writes these into the prompt for some templates
        params = t["function"].get("parameters")
        if params is not None and (not isinstance(params, dict)
                                   or not isinstance(params.get("properties", {}), dict)):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object "
                                "whose 'properties' is an object", f"tools[{i}].function.parameters")
    return tools


def as_chat_tools(tools, read_tool) -> list | None:
    """Another API's tool list as chat tools: ``read_tool(i, tool)`` checks one and returns its
    (name, description or None, JSON schema of its parameters)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        name, description, parameters = read_tool(i, tool)
        fn = {"name": name, "parameters": parameters}
        if isinstance(description, str):
            fn["description"] = description
        out.append({"type": "function", "function": fn})
    return parse_tools({"tools": out})


_ID_PREFIX = os.urandom(6).hex()    # unique per process; a counter makes each id unique within it
_ID_COUNTER = itertools.count()


def completion_id(kind: str = "chatcmpl") -> str:
    """A unique response id without a system call per response (uuid4 reads /dev/urandom)."""
    return f"{kind}-{_ID_PREFIX}{next(_ID_COUNTER):012x}"


def pieces(text: str, size: int = 16) -> list[str]:
    """A recorded answer replayed as small stream deltas (its tokens were sampled already: a
    client sees the same text either way; deltas of a few characters keep a UI's typing)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


def chat_response(model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": completion_id(), "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def chunk(cid: str, model: str, index: int, delta: dict, finish_reason=None, usage=None) -> dict:
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
    if usage is not None:
        body["choices"], body["usage"] = [], usage
    return body


def render_prompt(tokenizer, messages: list, tools: list | None) -> list[int]:
    """The prompt ids for a conversation: the chat template, then the tokenizer, exactly as
    the gateway does it (the learner re-renders with it when asked to ignore tool lists)."""
    messages, tools = tool_calls.render_messages(tokenizer, messages, tools)
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
