"""Tool calls in and out of a model's text, for every chat template.

A chat template that renders ``tools`` gets them as is, and the model's calls are parsed in
the format its family writes (``FORMATS``; chosen from the template once, or named in the
model entry as ``tool_parser``):

    hermes        ``<tool_call>{"name": .., "arguments": {..}}</tool_call>`` (Qwen, Hermes, most)
    llama3_json   ``{"name": .., "parameters": {..}}``, several joined by ``;``, maybe after
                  ``<|python_tag|>`` (Llama 3.1 / 3.2 / 3.3)
    mistral       ``[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`` (Mistral, Mixtral)
    pythonic      ``[name(key="value")]`` — for templates that know no tools (below)

Many small chat models (SmolLM2 among them) have templates that know no tools: they drop the
tool list and fail on an assistant message without content.  For those the gateway writes the
tools into the system message itself, in the *pythonic* style that vLLM's ``pythonic`` parser
also reads (``[calculator(expression="2 * 3")]``): small models imitate a function call far
more readily than a JSON block (SmolLM2-135M: 12 of 64 samples against 0 of 64,
docs/real-models.md).  Every format parses several calls in one answer (parallel calls).

The rendering of a call is canonical, so an agent that sends the parsed call back renders to
the very tokens the model sampled, and the context tracker merges the turns into one sequence.
"""
from __future__ import annotations

import ast
import json
import re
import uuid

_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
MAX_CLOSERS = 16     # a pythonic call's arguments hold at most this many ")" (the parser tries each)


def template_knows_tools(tokenizer) -> bool:
    """Whether the chat template renders a ``tools`` list (else the gateway writes it)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template if isinstance(template, str) else True


def _call(name: str, arguments) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": str(name), "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)}}


# -- Hermes: the template renders the tools; the model writes JSON blocks -------------------------
def split_hermes(text: str) -> tuple[str | None, list[dict]]:
    """Parse Hermes-style ``<tool_call>{"name":..., "arguments":...}</tool_call>`` blocks."""
    calls = []
    for match in _HERMES.finditer(text):
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "name" in data:
            calls.append(_call(data["name"], data.get("arguments", {})))
    if not calls:
        return text, []
    rest = _HERMES.sub("", text).strip()
    return (rest or None), calls


# -- Llama 3.x JSON and Mistral: the template renders the tools; the model writes JSON ----------
def _json_objects(text: str) -> list[tuple[int, int, object]]:
    """(start, end, value) of each JSON value that starts at a '{' or '[' in ``text``."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        out.append((start, end, value))
        pos = end
    return out


def _named_calls(values, args_key: str) -> list[dict]:
    return [_call(v["name"], v.get(args_key, v.get("arguments", {}))) for v in values
            if isinstance(v, dict) and isinstance(v.get("name"), str)]


def split_llama3_json(text: str) -> tuple[str | None, list[dict]]:
    """``{"name": .., "parameters": {..}}`` objects (after ``<|python_tag|>`` or not)."""
    body = text.replace("<|python_tag|>", "")
    calls, spans = [], []
    for start, end, value in _json_objects(body):
        found = _named_calls([value], "parameters")
        if found:
            calls += found
            spans.append((start, end))
    if not calls:
        return text, []
    rest = "".join(body[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(body)]))
    return (rest.replace(";", " ").strip() or None), calls


def split_mistral(text: str) -> tuple[str | None, list[dict]]:
    """``[TOOL_CALLS]`` followed by a JSON list of ``{"name", "arguments"}``."""
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:
        return text, []
    objects = _json_objects(tail)
    if not objects or not isinstance(objects[0][2], list):
        return text, []
    calls = _named_calls(objects[0][2], "arguments")
    if not calls:
        return text, []
    rest = (head + tail[objects[0][1]:]).strip()
    return (rest or None), calls


# -- pythonic: the gateway renders the tools; the model writes function calls ---------------------
def _signature(tool: dict) -> str:
    fn = tool["function"]
    props = (fn.get("parameters") or {}).get("properties") or {}
    params = ", ".join(f"{k}: {v.get('type', 'any')}" if isinstance(v, dict) else k for k, v in props.items())
    line = f"{fn['name']}({params})"
    return f"{line} - {fn['description']}" if fn.get("description") else line


def format_call(name: str, arguments: str | dict) -> str:
    """The one way a call is written: ``[name(key="value", n=3)]`` (JSON values)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {}
    args = arguments if isinstance(arguments, dict) else {}
    return f"[{name}(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()) + ")]"


def inline_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation as plain-content messages for a template that knows no tools: the tool
    list joins the system message, assistant calls become their pythonic text, tool results
    come back as user messages."""
    out = []
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            calls = " ".join(format_call(c["function"]["name"], c["function"].get("arguments") or "{}")
                             for c in msg["tool_calls"])
            text = f"{msg['content']} {calls}" if msg.get("content") else calls
            out.append({"role": "assistant", "content": text})
        elif msg.get("role") == "tool":
            out.append({"role": "user", "content": msg.get("content") or ""})
        else:
            out.append({"role": msg["role"], "content": msg.get("content") or ""})
    if tools:
        guide = ("You can call these tools:\n" + "\n".join(_signature(t) for t in tools)
                 + '\nTo call a tool, reply with [name(argument="value")] and nothing else; '
                 "its result comes back in the next message.")
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{guide}".strip()}
        else:
            out.insert(0, {"role": "system", "content": guide})
    return out


def _parse_call(source: str, name: str, first_param: str | None) -> dict | None:
    """``name(...)`` as a dict of arguments, or None if it is not a call of literals."""
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.func.id != name:
        return None
    literals = {"true": True, "false": False, "null": None}

    def value(v):
        if isinstance(v, ast.Name) and v.id in literals:
            return literals[v.id]
        return ast.literal_eval(v)
    try:
        args = {kw.arg: value(kw.value) for kw in node.keywords if kw.arg}
        if node.args:
            if len(node.args) > 1 or first_param is None or first_param in args:
                return None
            args[first_param] = value(node.args[0])
    except (ValueError, TypeError, SyntaxError):
        return None
    return args


def split_pythonic(text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
    """Calls of the request's tools written as ``[name(k=v)]`` (brackets optional); a single
    positional argument goes to the tool's first parameter."""
    params = {}
    for t in tools:
        props = list(((t["function"].get("parameters") or {}).get("properties") or {}))
        params[t["function"]["name"]] = props[0] if props else None
    if not params:
        return text, []
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in params) + r")\s*\(")
    calls, spans, pos = [], [], 0
    while (m := pattern.search(text, pos)):
        name, found = m.group(1), None
        end = text.find(")", m.end())
        for _ in range(MAX_CLOSERS):        # a bound: this runs on every answer, in the gateway
            if end < 0:
                break
            args = _parse_call(text[m.start():end + 1], name, params[name])
            if args is not None:
                found = (end + 1, args)
                break
            end = text.find(")", end + 1)
        if found is None:
            pos = m.end()
            continue
        calls.append(_call(name, found[1]))
        start, stop = m.start(), found[0]
        if text[:start].rstrip().endswith("[") and text[stop:].lstrip().startswith("]"):
            start, stop = text[:start].rstrip().rfind("["), stop + text[stop:].find("]") + 1
        spans.append((start, stop))
        pos = stop
    if not calls:
        return text, []
    rest = "".join(text[a:b] for a, b in zip([0] + [s[1] for s in spans], [s[0] for s in spans] + [len(text)]))
    return (rest.strip() or None), calls


FORMATS = ("hermes", "llama3_json", "mistral", "pythonic")


def tool_format(tokenizer, named: str = "") -> str:
    """The format this model writes calls in: ``named`` (the model entry's ``tool_parser``),
    else read from its chat template."""
    if named:
        return named
    if not template_knows_tools(tokenizer):
        return "pythonic"
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else json.dumps(template)
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "hermes"


def split_tool_calls(text: str, tools: list[dict] | None, tokenizer, named: str = "") -> tuple[str | None, list[dict]]:
    """The answer's text and its tool calls, in the format this model writes them."""
    if not tools:
        return text, []
    fmt = tool_format(tokenizer, named)
    if fmt == "pythonic":
        return split_pythonic(text, tools)
    return {"hermes": split_hermes, "llama3_json": split_llama3_json, "mistral": split_mistral}[fmt](text)


def render_messages(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list | None]:
    """What goes into ``apply_chat_template``: as is for a template that renders tools; the
    tools written in for one that does not."""
    if template_knows_tools(tokenizer):
        return messages, tools
    if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        return inline_tools(messages, tools), None
    return messages, None
