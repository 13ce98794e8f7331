"""The calculator task (agents/calculator.py) as an OpenAI Agents SDK agent.

The SDK's default model class, ``OpenAIResponsesModel``, speaks the Responses API
(``POST /v1/responses``); it gets an ``AsyncOpenAI`` client pointed at the gateway with the
episode's key.  A ``@function_tool`` is offered; the SDK runs it when the model calls it and
sends the output back as a ``function_call_output`` item.  Tracing is switched off: it would
send spans to OpenAI.  (The SDK's import name is ``agents``, like this repository's package:
agents/__init__.py makes both importable.)

    as a behavior:  behavior = "agents.examples.openai_agents_sdk:behavior"
    client mode:    python -m actorjet_agents.examples.client_mode actorjet_agents.examples.openai_agents_sdk GATEWAY --token T
"""
from __future__ import annotations

from openai import AsyncOpenAI

from agents import Agent, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, OpenAIResponsesModel, Runner, function_tool
from actorjet_agents import calculator as calc
from agents import set_tracing_disabled


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calc.calculate(expression)


def behavior(task: dict, llm) -> float:
    set_tracing_disabled(True)          # here, not at import: a shipped behavior's module is not re-run
    model = OpenAIResponsesModel(model=llm.model(),
                                 openai_client=AsyncOpenAI(base_url=llm.base_url(), api_key=llm.api_key, max_retries=2))
    agent = Agent(name="calculator", instructions="Answer with the number.", tools=[calculator], model=model,
                  model_settings=ModelSettings(temperature=calc.TEMPERATURE))
    try:
        result = Runner.run_sync(agent, task["question"], max_turns=calc.MAX_CALLS + 1)
    except (MaxTurnsExceeded, ModelBehaviorError):      # calls without end, or an answer cut at the
        return 0.0                                        # token limit (the SDK raises on "incomplete")
    return calc.score(task, str(result.final_output))
