"""The calculator task (agents/calculator.py) as an agent on Anthropic's ``anthropic`` SDK.

It speaks only the Messages API (``POST /v1/messages``): the episode key goes in as the SDK's
``api_key`` (sent as ``x-api-key``), tools as ``input_schema``, the model's calls come back as
``tool_use`` blocks and their results go back as ``tool_result`` blocks.  The gateway records
each call like a chat call, so the turns merge into one training sequence.

    as a behavior:  behavior = "agents.examples.anthropic_calculator:behavior"
    client mode:    python -m actorjet_agents.examples.client_mode actorjet_agents.examples.anthropic_calculator GATEWAY --token T
"""
from __future__ import annotations

import anthropic

from actorjet_agents import calculator

TOOLS = [{"name": "calculator", "description": "Evaluate an arithmetic expression.",
          "input_schema": calculator.TOOLS[0]["function"]["parameters"]}]


def play(task: dict, client: anthropic.Anthropic, model: str) -> float:
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(calculator.MAX_CALLS):
        reply = client.messages.create(model=model, max_tokens=calculator.ANSWER_TOKENS, tools=TOOLS,
                                       messages=messages)
        calls = [b for b in reply.content if b.type == "tool_use"]
        text = "".join(b.text for b in reply.content if b.type == "text")
        if not calls:
            return calculator.score(task, text)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id,
             "content": calculator.calculate(b.input.get("expression", "")) if b.name == "calculator"
             else f"error: no tool {b.name!r}"} for b in calls]})
    return 0.0


def behavior(task: dict, llm) -> float:
    client = anthropic.Anthropic(base_url=llm.base_url().removesuffix("/v1"), api_key=llm.api_key, max_retries=2)
    return play(task, client, llm.model())

