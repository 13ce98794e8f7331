"""The calculator task (agents/calculator.py) as a LangGraph ReAct agent.

Plain LangGraph: ``create_react_agent`` over LangChain's ``ChatOpenAI`` pointed at the
gateway, with a ``@tool``.  LangChain sends chat completions with ``tools=``; the gateway
parses the model's calls into ``tool_calls`` that LangChain turns into its own ToolCall
objects, runs the tool, and sends the result back as a tool message — the turns merge into
one training sequence.  Works on any task with ``question`` and ``answer`` (the first number
of the final answer is scored).

    as a behavior:  behavior = "agents.examples.langgraph_react:behavior"
    client mode:    python -m actorjet_agents.examples.client_mode actorjet_agents.examples.langgraph_react GATEWAY --token T
"""
from __future__ import annotations

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from actorjet_agents import calculator as calc


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calc.calculate(expression)


def behavior(task: dict, llm) -> float:
    model = ChatOpenAI(model=llm.model(), base_url=llm.base_url(), api_key=llm.api_key, max_retries=2,
                       temperature=calc.TEMPERATURE)
    agent = create_react_agent(model, [calculator])
    try:
        state = agent.invoke({"messages": [("user", task["question"])]},
                             {"recursion_limit": 2 * calc.MAX_CALLS + 1})
    except GraphRecursionError:
        return 0.0                      # it kept calling the tool
    return calc.score(task, state["messages"][-1].content)
