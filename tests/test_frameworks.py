"""Agents written with the frameworks people use, unchanged, against real gateways: LangChain /
LangGraph (chat completions), the OpenAI Agents SDK (its default model class: the Responses
API), the anthropic SDK (the Messages API) and AgentScope.  The wire on tiny-arith in-process,
then every example agent training on a real head (agents/examples/)."""
import asyncio
import json
from pathlib import Path

import pytest

from actorjet import signing
from gateways import tiny_gateway
from swarm import REPO, wait_until

for package in ("langgraph", "langchain_openai", "anthropic", "agentscope", "agents"):   # extra `frameworks` (CI installs it)
    pytest.importorskip(package, reason="pip install -e '.[frameworks]' for the framework tests")

pytestmark = pytest.mark.slow      # the frameworks take ~15 s to import: not in the fast tier
SECRET = "frameworks"
EXAMPLES = ("langgraph_react", "openai_agents_sdk", "anthropic_calculator", "agentscope_react")


@pytest.fixture(scope="module")
def served():
    with tiny_gateway(SECRET) as both:
        yield both


def calls_of(gw, episode):
    gw.store.flush()
    return gw.store.calls([episode])[episode]


def test_the_examples_install_as_actorjet_agents_and_agents_is_the_sdks():
    """The repository's agents/ folder is the package actorjet_agents (setup.cfg), never a
    top-level `agents`: that is the OpenAI Agents SDK's, which imports whole beside it.  A job
    naming `agents.arithmetic` (the folder's name) resolves to actorjet_agents.arithmetic."""
    import agents
    from agents import Agent, Runner
    from actorjet.config import examples_name, normalize
    import actorjet_agents.arithmetic as arithmetic

    assert Agent.__module__ == "agents.agent" and Runner.__module__ == "agents.run"
    assert "site-packages" in agents.__file__ and not (REPO / "agents" / "__init__.py").exists()
    assert Path(arithmetic.__file__).parent == REPO / "agents"
    job = normalize({"tasks": [{"name": "a", "source": "agents.arithmetic", "behavior": "agents.arithmetic:behavior"}]})
    assert (job["tasks"][0]["source"], job["tasks"][0]["behavior"]) == \
        ("actorjet_agents.arithmetic", "actorjet_agents.arithmetic:behavior")
    assert examples_name("agents.run") == "agents.run"            # none of ours: the name as given


def test_langchain_invoke_stream_async_and_batch(served):
    from langchain_openai import ChatOpenAI

    gw, server = served
    model = ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "lc"),
                       max_tokens=4, max_retries=0)
    said = model.invoke("12+30=")
    assert isinstance(said.content, str) and said.response_metadata["finish_reason"] in ("stop", "length")
    streamed = "".join(chunk.content for chunk in model.stream("12+30="))
    awaited = asyncio.run(model.ainvoke("40+2="))
    batch = model.batch(["1+1=", "2+2="])
    assert isinstance(streamed, str) and isinstance(awaited.content, str) and len(batch) == 2
    assert len(calls_of(gw, "lc")) == 5                              # every call recorded under the episode


def test_agents_sdk_default_model_runs_sync_streamed_and_async(served):
    from openai import AsyncOpenAI

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    gw, server = served
    set_tracing_disabled(True)
    def agent():          # a client per event loop (its connections belong to the loop that opened them)
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "sdk"), max_retries=0)
        return Agent(name="adder", model=OpenAIResponsesModel(model="tiny", openai_client=client),
                     model_settings=ModelSettings(temperature=0))     # greedy: "42" and the end of turn
    result = Runner.run_sync(agent(), "12+30=")
    assert isinstance(result.final_output, str)

    async def streamed():
        run = Runner.run_streamed(agent(), "40+2=")
        kinds = [event.type async for event in run.stream_events()]
        return run.final_output, kinds
    final, kinds = asyncio.run(streamed())
    assert isinstance(final, str) and "raw_response_event" in kinds
    assert len(calls_of(gw, "sdk")) == 2
    assert [c["messages"] for c in calls_of(gw, "sdk")] == [[{"role": "user", "content": "12+30="}],
                                                            [{"role": "user", "content": "40+2="}]]


JOB = """
[[models]]
name = "policy"
source = "tiny-long"          # 32k positions: AgentScope's prompt alone is ~600 tokens
default_max_tokens = 8
eval_every = 1000
{tasks}
[train]
group_size = 2
groups_per_step = 4
steps = {steps}
runner_concurrency = 8
"""
TASK = """[[tasks]]
name = "{name}"
source = "agents.arithmetic"
behavior = "agents.examples.{name}:behavior"
"""


def test_every_example_agent_trains_on_a_real_head(swarm, tmp_path):
    """Each example is shipped to the runners as a behavior, runs its framework there, and its
    groups are stored and trained (on tiny-long, a random-weight character model: this is the
    wire, not the learning; agents/calculator.py's recipe with SmolLM2 is the learning)."""
    steps = 4
    (tmp_path / "job.toml").write_text(JOB.format(tasks="".join(TASK.format(name=n) for n in EXAMPLES), steps=steps))
    run = tmp_path / "run"
    from actorjet.runtime.head import attach_root, status as head_status

    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=2,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what=f"{steps} learner steps")
    data = status()
    assert data["models"][0]["learner_step"] == steps
    for name in EXAMPLES:
        task = data["tasks"][name]
        assert task["completed"] > 0 and not task["aborted_by_cause"], (name, task)
    logged = wait_until(lambda: [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()], 10,
                        what="groups.jsonl")
    assert {g["task_name"] for g in logged} == set(EXAMPLES)
