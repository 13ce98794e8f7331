"""Real tool calls through each agent framework, on a real chat model (SmolLM2-135M-Instruct).

One episode per framework against one gateway, each through that framework's own agent
loop and API: LangGraph's ReAct agent (chat completions), the OpenAI Agents SDK's default
model class (Responses API), the ``anthropic`` SDK (Messages API) and AgentScope's ReAct agent
(chat completions).  Each must get its own tool-call objects back parsed, run the tool and
send the result back; then the four episodes form one group whose turns merge into one
training sequence per episode, and the learner takes a step on them.

SmolLM2-135M seldom calls a tool on its own (docs/real-models.md: RL is what teaches it), so
each agent forces its first call with ``tool_choice`` naming the calculator — in the way its
framework offers — and lets the model answer freely after the tool result.  The gateway's
named-call opening and closing (serving/tool_choice.py) are what this exercises.
"""
import asyncio
import json

import pytest

from actorjet import signing
from actorjet.rl.calls import messages
from actorjet_agents import calculator as calc
from extras import needs_smollm2
from gateways import tiny_gateway

pytestmark = [pytest.mark.slow,
              needs_smollm2]
for package in ("langgraph", "langchain_openai", "anthropic", "agentscope", "agents"):
    pytest.importorskip(package, reason="pip install -e '.[frameworks]' for the framework tests")

SECRET = "tools"
TASK = {"question": "What is 583 * 94?", "answer": "54802"}
MAX_TOKENS = 24


def langgraph_react(url: str, key: str) -> dict:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    from actorjet_agents.examples.langgraph_react import calculator

    model = ChatOpenAI(model="smollm2", base_url=url + "/v1", api_key=key, max_retries=0, temperature=0,
                       max_tokens=MAX_TOKENS)

    def pick(state, runtime):        # LangGraph's dynamic model: the calculator first, then free
        called = any(isinstance(m, ToolMessage) for m in state["messages"])
        return model.bind_tools([calculator], tool_choice="auto" if called else "calculator")
    state = create_react_agent(pick, [calculator]).invoke({"messages": [("user", TASK["question"])]},
                                                          {"recursion_limit": 6})
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    results = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"calls": [(c["name"], c["args"]) for c in calls], "results": results,
            "final": state["messages"][-1].content}


def openai_agents_sdk(url: str, key: str) -> dict:
    from openai import AsyncOpenAI

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from actorjet_agents.examples.openai_agents_sdk import calculator
    from agents.items import ToolCallItem, ToolCallOutputItem

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="smollm2", openai_client=AsyncOpenAI(base_url=url + "/v1", api_key=key,
                                                                            max_retries=0))
    agent = Agent(name="calculator", instructions="Answer with the number.", tools=[calculator], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS, tool_choice="calculator"))
    result = Runner.run_sync(agent, TASK["question"], max_turns=4)   # the SDK resets tool_choice after a call
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return {"calls": [(c.name, json.loads(c.arguments)) for c in calls], "results": outputs,
            "final": str(result.final_output)}


def anthropic_sdk(url: str, key: str) -> dict:
    import anthropic

    from actorjet_agents.examples.anthropic_calculator import TOOLS

    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    messages, calls, results = [{"role": "user", "content": TASK["question"]}], [], []
    choice = {"type": "tool", "name": "calculator"}
    for _ in range(3):
        reply = client.messages.create(model="smollm2", max_tokens=MAX_TOKENS, tools=TOOLS, messages=messages,
                                       tool_choice=choice, extra_body={"temperature": 0})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return {"calls": calls, "results": results, "final": "".join(b.text for b in reply.content)}
        assert reply.stop_reason == "tool_use"
        calls += [(b.name, b.input) for b in uses]
        results += [calc.calculate(b.input.get("expression", "")) for b in uses]
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": r}
                                                  for b, r in zip(uses, results[-len(uses):])]}]
        choice = {"type": "auto"}
    return {"calls": calls, "results": results, "final": None}


def agentscope_react(url: str, key: str) -> dict:
    from agentscope.agent import Agent, ReActConfig
    from agentscope.credential import OpenAICredential
    from agentscope.message import UserMsg
    from agentscope.model import OpenAIChatModel
    from agentscope.tool import FunctionTool, ToolChoice, Toolkit

    from actorjet_agents.examples import agentscope_react as example

    ran = []

    def calculator(expression: str):
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. "583 * 94"
        """
        ran.append(expression)
        return example.calculator(expression)

    class CalculatorFirst(OpenAIChatModel):
        """AgentScope's ReAct loop picks tool_choice itself; its first reasoning call names the tool."""
        async def __call__(self, messages, tools=None, tool_choice=None, **kwargs):
            return await super().__call__(messages, tools, tool_choice or ToolChoice(mode="calculator"), **kwargs)

    model = CalculatorFirst(credential=OpenAICredential(api_key=key, base_url=url + "/v1"), model="smollm2",
                            stream=False, max_retries=0,
                            parameters=OpenAIChatModel.Parameters(temperature=0, max_tokens=MAX_TOKENS))
    agent = Agent(name="calculator", system_prompt="Answer with the number.", model=model,
                  toolkit=Toolkit(tools=[FunctionTool(calculator)]), state=example.allowed("calculator"),
                  react_config=ReActConfig(max_iters=1))       # one call, then its answer (tool_choice none)
    reply = asyncio.run(agent.reply(UserMsg(name="user", content=TASK["question"])))
    return {"calls": [("calculator", {"expression": e}) for e in ran], "results": [calc.calculate(e) for e in ran],
            "final": reply.get_text_content()}


FRAMEWORKS = {"langgraph": langgraph_react, "openai_agents_sdk": openai_agents_sdk,
              "anthropic": anthropic_sdk, "agentscope": agentscope_react}


@pytest.fixture(scope="module")
def played():
    """Each framework plays one episode of group "g"; (gateway, {framework: outcome or error})."""
    import torch

    torch.set_num_threads(2)
    with tiny_gateway(SECRET, MAX_TOKENS, source="smollm2-135m", name="smollm2") as (gw, server):
        outcomes = {}
        for member, (name, play) in enumerate(FRAMEWORKS.items()):
            episode = f"g.{member}"
            try:
                outcomes[name] = dict(play(server.url, signing.mint_key(SECRET, episode)), episode=episode)
            except Exception as e:       # noqa: BLE001 - each framework's test reports its own failure
                outcomes[name] = e
        gw.store.flush()
        yield gw, outcomes


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_the_framework_gets_its_tool_call_parsed_and_sends_the_result_back(played, framework):
    gw, outcomes = played
    outcome = outcomes[framework]
    if isinstance(outcome, Exception):
        raise outcome
    name, args = outcome["calls"][0]
    assert name == "calculator" and isinstance(args.get("expression"), str), outcome
    assert outcome["results"][0] == calc.calculate(args["expression"])
    assert isinstance(outcome["final"], str)
    calls = gw.store.calls([outcome["episode"]])[outcome["episode"]]
    last = messages(calls[-1])
    assert len(calls) >= 2 and {"role": "tool", "content": outcome["results"][0]}.items() <= \
        next(m for m in last if m["role"] == "tool").items()          # the tool's result went back


def test_the_episodes_turns_merge_into_one_sequence_each_and_the_learner_steps(played):
    import torch
    from transformers import AutoModelForCausalLM

    from actorjet.models import zoo
    from actorjet.rl import drift
    from actorjet.rl.batching import BatchConfig, next_batch
    from actorjet.rl.algorithms import Algorithm
    from actorjet.rl.grpo import collate, grpo_step, term_logprobs

    gw, outcomes = played
    episodes = [o["episode"] for o in outcomes.values() if not isinstance(o, Exception)]
    assert len(episodes) == len(FRAMEWORKS), outcomes
    rewards = {e: float(m % 2) for m, e in enumerate(episodes)}          # a spread, so advantages are not 0
    gw.store.put_results({"group_id": "g", "size": len(episodes), "task_name": "calculator"},
                         [{"episode_id": e, "member": m, "reward": rewards[e]} for m, e in enumerate(episodes)])
    decode = lambda ids: gw.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    batch = next_batch(gw.store, BatchConfig("smollm2", 1, merge="prefix", max_tokens=8192,
                                             prepare=lambda calls: {"drift_repairs": drift.repair_drift(calls, decode)}))
    stats = batch["stats"]
    assert stats["calls"] >= 2 * len(episodes)
    assert stats["sequences_after"] == len(episodes), stats            # every episode's turns in one sequence
    assert stats["drift_repairs"] == 0                                 # the re-rendered history is what was sampled

    model = AutoModelForCausalLM.from_pretrained(zoo.resolve("smollm2-135m"), dtype=torch.float32)
    tensors = collate(batch["samples"], gw.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        before = term_logprobs(model, tensors)
    # the learner's recompute in the merged sequences is the engine's logprob of each sampled token
    assert torch.allclose(before, tensors["old_logprobs"], atol=2e-3), (before - tensors["old_logprobs"]).abs().max()
    info = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1e-3), batch["samples"], Algorithm(),
                     gw.tokenizer.pad_token_id or 0)
    assert info["tokens"] == len(tensors["term_tok"]) and info["grad_norm"] > 0
    with torch.no_grad():
        after = term_logprobs(model, tensors)
    gain = lambda lp: float((tensors["advantages"] * lp).sum())  # noqa: E731  what the step ascends to first order
    assert gain(after) > gain(before)
