"""``tool_choice``: what each value means on this gateway (chat, Responses and Messages APIs).

    auto       the default: the model decides; calls in its answer are parsed.
    none       the tools are still shown to the model, but nothing it writes is parsed as a
               call: the answer is text.
    required   the gateway writes the *opening* of a tool call after the generation prompt —
               in the format the model writes calls in (serving/tool_calls.py): hermes
               ``<tool_call>`` + newline, llama3_json ``{"name": "``, mistral
               ``[TOOL_CALLS][{"name": "``, pythonic ``[`` — so the model can only go on
               with a call.
    a name     the opening includes the function's name and its first argument's name (the
               first ``required`` one, else the first property), with the opening quote when
               that argument is a string: e.g. hermes ``<tool_call>\n{"name": "NAME",
               "arguments": {"ARG": "``, pythonic ``[NAME(ARG="``.  The model writes only the
               values.  (A small model forced only up to ``[NAME(`` tends to write
               ``ARG: value``, which no parser takes: SmolLM2-135M did on the calculator task.)

A named call also *ends* where the format closes a call: hermes ``</tool_call>``, mistral
``}]``, pythonic ``)]`` are stop strings for that generation (kept in the answer, unlike a
request's own stops).  Without it a model that is not tool-trained goes on writing text after
the call, and the API cannot say in which order (``content`` and ``tool_calls`` are separate
fields), so the next turn's history re-renders the text first and can never extend the sampled
tokens: the turns stop merging.  llama3_json has no closing a string can name (its arguments
may nest braces): there the model ends the call itself.

This constrains the call's opening and end, not its whole grammar: if what the model writes
after it does not parse, the answer comes back as text with ``finish_reason`` "stop" — the broken
call is visible in the content, never dropped silently.  The forced tokens are part of the
recorded prompt (the model was conditioned on them), so the learner trains exactly what was
sampled after them; the answer's text includes them, so the parsed call is whole.

Accepted spellings: chat ``{"type": "function", "function": {"name": N}}``, Responses
``{"type": "function", "name": N}``, Messages ``{"type": "tool", "name": N}`` and
``{"type": "any"}`` (= required) — each route maps its own to the values above.
"""
from __future__ import annotations

from actorjet.serving.openai_api import ApiError
from actorjet.serving.tool_calls import tool_format

OPENINGS = {    # format → (opening for "required", opening for a named function, its first argument)
    "hermes": ("<tool_call>\n", '<tool_call>\n{{"name": "{name}", "arguments": ', '{{"{arg}": '),
    "llama3_json": ('{"name": "', '{{"name": "{name}", "parameters": ', '{{"{arg}": '),
    "mistral": ('[TOOL_CALLS][{"name": "', '[TOOL_CALLS][{{"name": "{name}", "arguments": ', '{{"{arg}": '),
    "pythonic": ("[", "[{name}(", "{arg}="),
}
CLOSINGS = {"hermes": "</tool_call>", "mistral": "}]", "pythonic": ")]"}    # where a named call ends


def first_argument(tools: list | None, name: str) -> tuple[str, bool] | None:
    """(name, is a string) of the argument a forced call of ``name`` opens with, if it has one."""
    for tool in tools or []:
        function = tool.get("function") or {}
        if function.get("name") != name:
            continue
        params = function.get("parameters") if isinstance(function.get("parameters"), dict) else {}
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        required = [r for r in params.get("required") or [] if isinstance(r, str) and r in props]
        first = (required or list(props) or [None])[0]
        if first is None or not first.isidentifier():
            return None
        schema = props[first] if isinstance(props[first], dict) else {}
        return first, schema.get("type") == "string"
    return None


def parse_tool_choice(value, tools: list | None, param: str = "tool_choice") -> str | dict | None:
    """None / "auto" / "none" / "required" / {"name": N} (a tool of the request)."""
    if value is None or value == "auto":
        return None
    if value in ("none", "required"):
        if value == "required" and not tools:
            raise ApiError(400, f"'{param}' is \"required\" but the request has no tools", param)
        return value
    if isinstance(value, dict):
        name = value.get("name")
        if name is None and isinstance(value.get("function"), dict):
            name = value["function"].get("name")
        names = [t["function"]["name"] for t in tools or []]
        if not isinstance(name, str) or name not in names:
            raise ApiError(400, f"'{param}' names the function {name!r}, which is not among the request's "
                                f"tools {names}", param)
        return {"name": name}
    raise ApiError(400, f"'{param}' must be \"auto\", \"none\", \"required\" or a function to call", param)


def opening(tokenizer, choice, named_format: str = "", tools: list | None = None) -> str:
    """The text the gateway writes after the generation prompt for this choice ('' for none);
    ``tools`` in chat-completions form."""
    if choice is None or choice == "none":
        return ""
    required, named, argument = OPENINGS[tool_format(tokenizer, named_format)]
    if not isinstance(choice, dict):
        return required
    text = named.format(name=choice["name"])
    first = first_argument(tools, choice["name"])
    if first is not None:
        text += argument.format(arg=first[0]) + ('"' if first[1] else "")
    return text


def closing(tokenizer, choice, named_format: str = "") -> list[str]:
    """The stop strings that end a named call ([] otherwise)."""
    if not isinstance(choice, dict):
        return []
    end = CLOSINGS.get(tool_format(tokenizer, named_format))
    return [end] if end else []


def tool_choice_prefix(tokenizer, tools: list | None, choice, named_format: str = "") -> list[int]:
    """The opening's token ids (none when the model is free to answer as it likes)."""
    text = opening(tokenizer, choice, named_format, tools) if tools else ""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
