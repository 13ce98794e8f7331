"""``POST /v1/messages``: Anthropic's Messages API on every gateway.

Harnesses written against the ``anthropic`` SDK (and CLI agents that speak only this API)
connect to a gateway unchanged: the episode key goes in ``x-api-key`` (the SDK's default) or
as a bearer token.  A request becomes the chat-completions form (``to_chat``), is answered by
the gateway's one path (GatewayApp.answer: render → generate → record), and the answer
becomes content blocks — so it is recorded exactly like a chat call, and its turns merge.

Supported: ``system`` (a string or text blocks); ``messages`` whose content is a string or
``text`` / ``tool_use`` / ``tool_result`` blocks; ``tools`` with ``input_schema``;
``tool_choice`` (auto, any, tool, none: serving/tool_choice.py); ``stop_sequences``,
``max_tokens`` (required, as in Anthropic's API; a cap: more than the context leaves after
the prompt is cut to what it leaves), ``temperature`` (0 to 1), ``top_p``;
``stream`` with Anthropic's event names; ``usage``.  Errors on this route have Anthropic's
shape (``{"type": "error", "error": {"type", "message"}}``); images and documents are a 400
that says so; thinking blocks a harness echoes back are skipped (these models write none), and
options of newer APIs that do not change a plain answer (``thinking``, ``metadata``, cache
control) are accepted and ignored.
"""
from __future__ import annotations

import json

from aiohttp import web

from actorjet.checks import number_in
from actorjet.serving import openai_api as api
from actorjet.serving.openai_api import ApiError
from actorjet.serving.tool_choice import parse_tool_choice

SKIPPED = ("thinking", "redacted_thinking")     # echoed back by harnesses; these models write none
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(err: ApiError) -> dict:
    """An ApiError in Anthropic's shape (the field, when known, is named in the message)."""
    kind = ERROR_TYPES.get(err.status, "api_error")
    message = err.message if not err.param or err.param in err.message else f"{err.param}: {err.message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    content = [b for b in content if not (isinstance(b, dict) and b.get("type") in SKIPPED)]
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") not in ("text", "tool_use", "tool_result"):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ApiError(400, f"{where}.content[{j}]: blocks of type {kind!r} are not supported here (text, "
                                "tool_use, tool_result)", f"{where}.content")
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise ApiError(400, f"{where}.content[{j}].text must be a string", f"{where}.content")
    return content


def _result_text(block: dict, where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(b.get("text", "") for b in _blocks(content, where) if b["type"] == "text")
    if not isinstance(content, str):
        raise ApiError(400, f"{where}: a tool_result's content must be a string or text blocks", where)
    return f"Error: {content}" if block.get("is_error") else content


def to_messages(body: dict) -> list[dict]:
    """system + messages → chat messages (tool_use blocks become tool_calls, tool_result
    blocks tool messages, in their order)."""
    out: list[dict] = []
    system = body.get("system")
    if system is not None:
        text = system if isinstance(system, str) else "".join(
            b["text"] for b in _blocks(system, "system") if b["type"] == "text")
        if text:
            out.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    for i, msg in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"{at}.role must be user or assistant", f"{at}.role")
        texts, calls = [], []
        for j, block in enumerate(_blocks(msg.get("content"), at)):
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use" and msg["role"] == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                        or not isinstance(block.get("input", {}), dict):
                    raise ApiError(400, f"{at}.content[{j}]: a tool_use needs a string id and name and an "
                                        "object input", f"{at}.content")
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif block["type"] == "tool_result" and msg["role"] == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise ApiError(400, f"{at}.content[{j}]: a tool_result needs its tool_use_id", f"{at}.content")
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_text(block, f"{at}.content[{j}]")})
            else:
                raise ApiError(400, f"{at}.content[{j}]: a {block['type']} block cannot come from the "
                                    f"{msg['role']}", f"{at}.content")
        if msg["role"] == "assistant":
            said = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                said["tool_calls"] = calls
            if said["content"] is not None or calls:
                out.append(said)
        elif texts or not any(m.get("role") == "tool" for m in out[-1:]):
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _tool(i: int, t) -> tuple[str, str | None, dict]:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"] \
            or not isinstance(t.get("input_schema"), dict):
        raise ApiError(400, f"tools[{i}] needs a name and an input_schema object (client tools only)", f"tools[{i}]")
    return t["name"], t.get("description"), t["input_schema"]


def to_tools(tools) -> list | None:
    """Messages tools (``input_schema``) → chat tools."""
    return api.as_chat_tools(tools, _tool)


def tool_choice(value, tools):
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "'tool_choice' must be {type: auto | any | tool | none}", "tool_choice")
    kind = value["type"]
    if kind == "tool":
        return parse_tool_choice({"name": value.get("name")}, tools)
    return parse_tool_choice({"any": "required"}.get(kind, kind), tools)


def sampling(body: dict) -> api.Sampling:
    if "max_tokens" not in body:
        raise ApiError(400, "'max_tokens' is required", "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and not number_in(temperature, 0, 1):
        raise ApiError(400, f"'temperature' must be a number between 0 and 1, got {temperature!r}", "temperature")
    fields = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "stream") if k in body}
    if body.get("stop_sequences") is not None:
        fields["stop"] = body["stop_sequences"]
    try:
        s = api.parse_sampling(fields, max_n=1)
    except ApiError as e:
        if e.param == "stop":
            e.param, e.message = "stop_sequences", "'stop_sequences' must be a list of up to 4 non-empty strings"
        raise
    s.cap_to_context = True      # harnesses written for large models send large max_tokens: a cap here
    return s


class MessagesRoutes:
    """``POST /v1/messages`` bound to one gateway (serving/gateway_app.py)."""

    def __init__(self, gw):
        self.gw = gw

    async def create(self, request):
        gw = self.gw
        episode_id = gw._episode(request)
        body = await api.read_json(request)
        gw._check_model(body)
        tools = to_tools(body.get("tools"))
        choice = tool_choice(body.get("tool_choice"), tools)
        s = sampling(body)
        messages = to_messages(body)
        prompt_ids, (answer,) = await gw.answer(request, episode_id, messages, tools, s, choice)
        message = self._message(answer, len(prompt_ids), s.stop)
        if s.stream:
            return await self._stream(request, message)
        return web.json_response(message)

    def _message(self, answer, n_prompt: int, stop: list[str]) -> dict:
        content = [{"type": "text", "text": answer.content}] if answer.content else []
        for call in answer.calls:
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                arguments = {}
            content.append({"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
                            "name": call["function"]["name"], "input": arguments if isinstance(arguments, dict) else {}})
        hit = None
        if stop and answer.finish_reason == "stop":     # which stop sequence ended it (decoded only then)
            said = self.gw.tokenizer.decode(answer.result.completion_ids, skip_special_tokens=True)
            hit = min((x for x in stop if x in said), key=said.find, default=None)
        reason = {"tool_calls": "tool_use", "length": "max_tokens"}.get(answer.finish_reason, "end_turn")
        if hit is not None and reason == "end_turn":
            reason = "stop_sequence"
        return {"id": api.completion_id("msg"), "type": "message", "role": "assistant", "model": self.gw.model,
                "content": content, "stop_reason": reason, "stop_sequence": hit,
                "usage": {"input_tokens": n_prompt, "output_tokens": len(answer.result.completion_ids)}}

    async def _stream(self, request, message: dict):
        """Anthropic's event sequence, replaying the recorded answer."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(kind: str, **data):
            await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

        usage = message["usage"]
        await send("message_start", message=dict(message, content=[], stop_reason=None, stop_sequence=None,
                                                  usage={"input_tokens": usage["input_tokens"], "output_tokens": 0}))
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                await send("content_block_start", index=index, content_block={"type": "text", "text": ""})
                for piece in api.pieces(block["text"]):
                    await send("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
            else:
                await send("content_block_start", index=index, content_block=dict(block, input={}))
                for piece in api.pieces(json.dumps(block["input"])):
                    await send("content_block_delta", index=index,
                               delta={"type": "input_json_delta", "partial_json": piece})
            await send("content_block_stop", index=index)
        await send("message_delta", delta={"stop_reason": message["stop_reason"],
                                           "stop_sequence": message["stop_sequence"]},
                   usage={"output_tokens": usage["output_tokens"]})
        await send("message_stop")
        await resp.write_eof()
        return resp

