"""The calculator task (agents/calculator.py) as an AgentScope ReAct agent.

AgentScope 2's ``Agent`` (a ReAct loop) with its ``OpenAIChatModel`` pointed at the gateway
(chat completions, ``tools=``) and the calculator as a ``FunctionTool`` in its ``Toolkit``:
AgentScope formats the conversation, runs the tool the model calls and sends the result back.
AgentScope asks a person before it runs any tool unless a rule allows it: the calculator is a
pure function, so the agent's permission context allows it (without the rule, every call ends
the reply with "I'm waiting for your permission").

    as a behavior:  behavior = "agents.examples.agentscope_react:behavior"
    client mode:    python -m actorjet_agents.examples.client_mode actorjet_agents.examples.agentscope_react GATEWAY --token T
"""
from __future__ import annotations

import asyncio

from agentscope.agent import Agent, ReActConfig
from agentscope.credential import OpenAICredential
from agentscope.message import TextBlock, UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionContext, PermissionRule
from agentscope.state import AgentState
from agentscope.tool import FunctionTool, ToolChunk, Toolkit

from actorjet_agents import calculator as calc


def calculator(expression: str) -> ToolChunk:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. "583 * 94"
    """
    return ToolChunk(content=[TextBlock(text=calc.calculate(expression))])


def allowed(*tools: str) -> AgentState:
    """An agent state whose permission rules let these tools run without asking anyone."""
    rules = {t: [PermissionRule(tool_name=t, rule_content=None, behavior=PermissionBehavior.ALLOW, source="actorjet")]
             for t in tools}
    return AgentState(permission_context=PermissionContext(allow_rules=rules))


def behavior(task: dict, llm) -> float:
    model = OpenAIChatModel(credential=OpenAICredential(api_key=llm.api_key, base_url=llm.base_url()),
                            model=llm.model(), stream=False, max_retries=2,
                            parameters=OpenAIChatModel.Parameters(temperature=calc.TEMPERATURE))
    agent = Agent(name="calculator", system_prompt="Answer with the number.", model=model,
                  toolkit=Toolkit(tools=[FunctionTool(calculator)]), state=allowed("calculator"),
                  react_config=ReActConfig(max_iters=calc.MAX_CALLS + 1))
    reply = asyncio.run(agent.reply(UserMsg(name="user", content=task["question"])))
    return calc.score(task, reply.get_text_content())
