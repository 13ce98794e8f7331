"""``tool_choice``: what each value means on this gateway (chat, Responses and Messages APIs).

    auto       the default: the model decides; calls in its answer are parsed.
    none       the tools are still shown to the model, but nothing it writes is parsed as a
               call: the answer is text.
    required   the gateway writes the *opening* of a tool call after the generation prompt —
               in the format the model writes calls in (serving/tool_calls.py): hermes
               ``<tool_call>`` + newline, llama3_json ``{"name": "``, mistral
               ``[TOOL_CALLS][{"name": "``, pythonic ``[`` — so the model can only go on
               with a call.
    a name     the opening includes the function's name up to its arguments (e.g. hermes
               ``<tool_call>\n{"name": "NAME", "arguments": ``, pythonic ``[NAME(``): the
               model writes only the arguments.

This constrains the call's opening, not its whole grammar: if what the model writes after
it does not parse, the answer comes back as text with ``finish_reason`` "stop" — the broken
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

OPENINGS = {    # format → (opening for "required", opening for a named function)
    "hermes": ("<tool_call>\n", '<tool_call>\n{{"name": "{name}", "arguments": '),
    "llama3_json": ('{"name": "', '{{"name": "{name}", "parameters": '),
    "mistral": ('[TOOL_CALLS][{"name": "', '[TOOL_CALLS][{{"name": "{name}", "arguments": '),
    "pythonic": ("[", "[{name}("),
}


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


def opening(tokenizer, choice, named_format: str = "") -> str:
    """The text the gateway writes after the generation prompt for this choice ('' for none)."""
    if choice is None or choice == "none":
        return ""
    required, named = OPENINGS[tool_format(tokenizer, named_format)]
    return named.format(name=choice["name"]) if isinstance(choice, dict) else required


def tool_choice_prefix(tokenizer, tools: list | None, choice, named_format: str = "") -> list[int]:
    """The opening's token ids (none when the model is free to answer as it likes)."""
    text = opening(tokenizer, choice, named_format) if tools else ""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
