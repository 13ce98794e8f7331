"""``POST /v1/responses``: OpenAI's Responses API on every gateway.

The OpenAI Agents SDK's default model class speaks it, and so do newer OpenAI clients.  A
request is turned into the chat-completions form the gateway already serves (``to_chat``),
answered by the same render → generate → record path (GatewayApp.answer), and the answer
is turned into Responses output items.  So a Responses call is recorded exactly like a chat
call, and the context tracker merges its turns the same way.

Supported: ``instructions``; ``input`` as a string or a list of items (messages whose content
is a string or ``input_text`` / ``output_text`` parts, ``function_call``,
``function_call_output``; ``reasoning`` items are skipped); function ``tools`` and
``tool_choice``; ``max_output_tokens``, ``temperature``, ``top_p``; ``stream`` (the documented
event sequence); ``usage``; ``previous_response_id`` within the same episode (the gateway
keeps the last RESPONSES_KEPT responses: their conversations, not their text twice); ``store``
and ``metadata`` accepted.  Anything else that changes the answer (images, built-in tools,
structured output formats) is a 400 that names the field.
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict

from aiohttp import web

from actorjet.serving import openai_api as api
from actorjet.serving.openai_api import ApiError
from actorjet.serving.tool_choice import parse_tool_choice

RESPONSES_KEPT = 20_000       # responses whose conversation previous_response_id can continue
MAX_ITEMS = 10_000


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of content parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise ApiError(400, f"{where}.content[{j}]: only text parts (input_text, output_text) are supported "
                                f"here, got {kind!r}", f"{where}.content")
    return "".join(texts)


def to_messages(items, where: str = "input") -> list[dict]:
    """Responses input items → chat messages (function calls joined to their assistant turn)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or len(items) > MAX_ITEMS:
        raise ApiError(400, f"'{where}' must be a string or a list of at most {MAX_ITEMS} items", where)
    out: list[dict] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{at} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{at}.role must be user, system, developer or assistant", f"{at}.role")
            out.append({"role": role, "content": _text_of(item.get("content"), at)})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name and isinstance(args, str)):
                raise ApiError(400, f"{at}: a function_call needs string call_id, name and arguments", at)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":      # calls of one turn join its message
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(400, f"{at}: a function_call_output needs its call_id", at)
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": output if isinstance(output, str) else _text_of(output, at)})
        elif kind == "reasoning":
            continue                     # this gateway's models produce none; a client may echo them
        else:
            raise ApiError(400, f"{at}: items of type {kind!r} are not supported (message, function_call, "
                                "function_call_output)", at)
    return out


def _tool(i: int, t) -> tuple[str, str | None, dict]:
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str) or not t["name"]:
        raise ApiError(400, f"tools[{i}]: only function tools {{type: 'function', name, parameters}} are "
                            "supported here", f"tools[{i}]")
    return t["name"], t.get("description"), t.get("parameters") or {"type": "object", "properties": {}}


def to_tools(tools) -> list | None:
    """Responses function tools → chat tools."""
    return api.as_chat_tools(tools, _tool)


def sampling(body: dict) -> api.Sampling:
    fields = {k: body[k] for k in ("temperature", "top_p", "stream") if k in body}
    if body.get("max_output_tokens") is not None:
        fields["max_tokens"] = body["max_output_tokens"]
    try:
        return api.parse_sampling(fields, max_n=1)
    except ApiError as e:
        if e.param == "max_tokens":
            e.param, e.message = "max_output_tokens", e.message.replace("'max_tokens'", "'max_output_tokens'")
        raise


def _check_format(body: dict) -> None:
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if body.get("text") is not None and not isinstance(body.get("text"), dict):
        raise ApiError(400, "'text' must be an object", "text")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError(400, "'text.format': only {type: 'text'} is supported (no structured output here)", "text.format")


class ResponsesRoutes:
    """``POST /v1/responses`` bound to one gateway (serving/gateway_app.py)."""

    def __init__(self, gw):
        self.gw = gw
        self.kept: OrderedDict[str, tuple[str, list[dict]]] = OrderedDict()   # id → (episode, conversation)

    def _previous(self, body: dict, episode_id: str) -> list[dict]:
        prev = body.get("previous_response_id")
        if prev is None:
            return []
        if not isinstance(prev, str):
            raise ApiError(400, "'previous_response_id' must be a string", "previous_response_id")
        kept = self.kept.get(prev)
        if kept is None:
            raise ApiError(400, f"previous_response_id {prev!r} is not known to this gateway: it keeps the last "
                                f"{RESPONSES_KEPT} responses of its own episodes (send the whole input instead)",
                           "previous_response_id")
        if kept[0] != episode_id:
            raise ApiError(400, f"previous_response_id {prev!r} belongs to another episode; an episode continues "
                                "only its own responses", "previous_response_id")
        return list(kept[1])

    async def create(self, request):
        gw = self.gw
        episode_id = gw._episode(request)
        body = await api.read_json(request)
        gw._check_model(body)
        if "input" not in body:
            raise ApiError(400, "'input' is required (a string or a list of items)", "input")
        if body.get("instructions") is not None and not isinstance(body.get("instructions"), str):
            raise ApiError(400, "'instructions' must be a string", "instructions")
        _check_format(body)
        tools = to_tools(body.get("tools"))
        choice = parse_tool_choice(body.get("tool_choice"), tools)
        s = sampling(body)
        conversation = self._previous(body, episode_id) + to_messages(body["input"])
        messages = ([{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []) \
            + conversation
        if not conversation:
            raise ApiError(400, "'input' holds no message", "input")
        prompt_ids, (answer,) = await gw.answer(request, episode_id, messages, tools, s, choice)
        response = self._response(body, answer, len(prompt_ids), tools)
        said = {"role": "assistant", "content": answer.content}
        if answer.calls:
            said["tool_calls"] = answer.calls
        self.kept[response["id"]] = (episode_id, conversation + [said])
        while len(self.kept) > RESPONSES_KEPT:
            self.kept.popitem(last=False)
        if s.stream:
            return await self._stream(request, response)
        return web.json_response(response)

    def _response(self, body: dict, answer, n_prompt: int, tools) -> dict:
        output = []
        if answer.content:
            output.append({"type": "message", "id": api.completion_id("msg"), "status": "completed",
                           "role": "assistant",
                           "content": [{"type": "output_text", "text": answer.content, "annotations": []}]})
        for call in answer.calls:
            output.append({"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"),
                           "call_id": call["id"], "name": call["function"]["name"],
                           "arguments": call["function"]["arguments"], "status": "completed"})
        n_out = len(answer.result.completion_ids)
        cut = answer.finish_reason == "length" and not answer.calls
        return {"id": api.completion_id("resp"), "object": "response", "created_at": int(time.time()),
                "status": "incomplete" if cut else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "error": None, "model": self.gw.model, "output": output,
                "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
                "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
                "parallel_tool_calls": True, "temperature": body.get("temperature", 1.0),
                "top_p": body.get("top_p", 1.0), "max_output_tokens": body.get("max_output_tokens"),
                "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True),
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "reasoning": None,
                "usage": {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": n_prompt + n_out}}

    async def _stream(self, request, response: dict):
        """The documented event sequence, replaying the recorded answer (as the chat route does)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = iter(range(1 << 30))

        async def send(kind: str, **data):
            event = {"type": kind, "sequence_number": next(seq), **data}
            await resp.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

        started = dict(response, status="in_progress", output=[], usage=None, incomplete_details=None)
        await send("response.created", response=started)
        await send("response.in_progress", response=started)
        for index, item in enumerate(response["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                await send("response.output_item.added", output_index=index,
                           item=dict(item, status="in_progress", content=[]))
                part = {"type": "output_text", "text": "", "annotations": []}
                await send("response.content_part.added", item_id=item["id"], output_index=index,
                           content_index=0, part=part)
                for piece in api.pieces(text):
                    await send("response.output_text.delta", item_id=item["id"], output_index=index,
                               content_index=0, delta=piece, logprobs=[])
                await send("response.output_text.done", item_id=item["id"], output_index=index,
                           content_index=0, text=text, logprobs=[])
                await send("response.content_part.done", item_id=item["id"], output_index=index,
                           content_index=0, part=dict(part, text=text))
            else:
                await send("response.output_item.added", output_index=index,
                           item=dict(item, status="in_progress", arguments=""))
                for piece in api.pieces(item["arguments"]):
                    await send("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                               delta=piece)
                await send("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           arguments=item["arguments"], name=item["name"])
            await send("response.output_item.done", output_index=index, item=item)
        await send("response.completed" if response["status"] == "completed" else "response.incomplete",
                   response=response)
        await resp.write_eof()
        return resp

