"""Tool calls for chat templates that know no tools (serving/tool_calls.py), multi-turn held-out
evaluation (models/evaluate.py) and the calculator agent's environment (agents/calculator.py),
with the real gateway, engine and tiny model."""
import json

import openai
import pytest

from actorjet import signing
from actorjet.models import evaluate, zoo
from actorjet.serving.transformers_engine import TransformersEngine
from actorjet.serving.gateway_app import GatewayApp, local_backend
from actorjet.models.heldout import eval_spec
from actorjet.serving.serve import AppServer
from actorjet.serving.tool_calls import MAX_CLOSERS, format_call, inline_tools, split_pythonic, template_knows_tools
from actorjet_agents import arithmetic, calculator

SECRET = "tool-secret"
TOOLS = calculator.TOOLS


def test_pythonic_calls_parse_in_the_openai_shape_and_render_back_the_same():
    content, calls = split_pythonic('[calculator(expression="583 * 94")]', TOOLS)
    assert content is None and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "calculator"
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "583 * 94"}
    # the canonical rendering of the parsed call is the text the model wrote
    assert format_call("calculator", calls[0]["function"]["arguments"]) == '[calculator(expression="583 * 94")]'
    # a positional argument goes to the first parameter; text around a call stays content
    content, calls = split_pythonic('Let me see: calculator("(2+3)*4") ok', TOOLS)
    assert content == "Let me see:  ok" and json.loads(calls[0]["function"]["arguments"]) == {"expression": "(2+3)*4"}
    # JSON literals, two calls
    _, calls = split_pythonic('[calculator(expression="1", exact=true)] [calculator(expression="2")]', TOOLS)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"expression": "1", "exact": True},
                                                                       {"expression": "2"}]
    # not calls: unknown tools, names, code, unbalanced text
    for text in ("calculator(x)", "add(1, 2)", "calculator(__import__('os'))", "calculator(", "no call"):
        assert split_pythonic(text, TOOLS) == (text, []), text
    # the parser tries at most MAX_CLOSERS ")" per call (it runs on every answer in the gateway)
    long_call = 'calculator("' + "(1)" * (MAX_CLOSERS + 1) + '")'
    assert split_pythonic(long_call, TOOLS) == (long_call, [])
    assert split_pythonic('calculator("' + "(1)" * (MAX_CLOSERS - 2) + '")', TOOLS)[1]


def test_a_template_without_tools_gets_them_written_into_the_conversation():
    tok = TransformersEngine(zoo.tiny_arith(0), start_thread=False).tokenizer
    assert not template_knows_tools(tok)
    msgs = inline_tools([{"role": "system", "content": "Be brief."}, *calculator.DEMO[:3]], TOOLS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\nYou can call these tools:\ncalculator(expression: string)")
    assert msgs[2]["content"] == '[calculator(expression="215 * 37")]' and msgs[3]["content"] == "7955"
    assert all(isinstance(m["content"], str) for m in msgs)


@pytest.fixture(scope="module")
def served():
    engine = TransformersEngine(zoo.tiny_arith(0))
    gw = GatewayApp("tiny", engine.tokenizer, local_backend(engine), SECRET, engine.max_len)
    server = AppServer(gw.app())
    yield gw, server, engine
    server.stop()
    engine.close()


def test_a_tool_conversation_through_the_gateway_renders_its_calls_and_results(served):
    """tiny-arith's template knows no tools (it printed an assistant call as "None"): the tool
    list, the call and its result are written into the conversation; the record keeps the tools."""
    gw, server, _ = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "t1"), max_retries=0)
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"properties": {"e": {}}}}}]
    messages = [{"role": "user", "content": "2*3"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2*3"}'}}]},
                {"role": "tool", "tool_call_id": "c", "content": "6"}, {"role": "user", "content": "1+1="}]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=4, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    call = gw.store.calls(["t1"])["t1"][0]
    # tiny-arith's tokenizer knows digits and signs only (letters decode as <unk>): the call's
    # argument is written after the question, the tool's result before the next one
    prompt = gw.tokenizer.decode(call["prompt_ids"])
    assert prompt.count("2*3") == 2 and prompt.endswith("61+1=") and "None" not in prompt
    assert call["tools"] == tools


def test_multi_turn_evaluation_plays_episodes_and_agrees_with_single_turn(served):
    """An eval_episode that asks once scores exactly what the single-turn evaluator scores."""
    _, _, engine = served
    spec = eval_spec("agents.arithmetic", "policy")
    single = evaluate.greedy_accuracy(engine.model, engine.tokenizer, spec, 8, limit=64)

    def one_turn(task, chat):
        return arithmetic.score(task, chat(arithmetic.messages(task), None, 8)["content"] or "")
    multi = evaluate.greedy_accuracy(engine.model, engine.tokenizer, (spec[0], None, one_turn), 8, limit=64)
    assert abs(multi - single) <= 1 / 64 and 0.1 < single < 0.9      # batches may differ by a float tie


def test_calculator_spec_is_multi_turn_and_its_environment_is_safe():
    eval_tasks, messages, episode = eval_spec("agents.calculator", "policy")
    assert messages is None and episode is calculator.eval_episode
    assert len(eval_tasks()) == 128 and {t["question"] for t in eval_tasks()}.isdisjoint(
        t["question"] for t in calculator.eval_tasks("test"))
    assert calculator.calculate("583 * 94") == "54802" and calculator.calculate("7 / 2") == "3.5"
    for bad in ("__import__('os')", "2 ** 99999999", "1/0", "x", ""):
        assert calculator.calculate(bad).startswith("error"), bad
    task = {"answer": "54802"}
    assert calculator.score(task, "54,802 books") == 1.0 and calculator.score(task, "583 * 94") == 0.0

    # an episode: a call, the environment's answer, then the final reply
    seen = []

    def ask(msgs, tools, max_tokens):
        seen.append(msgs)
        if len(seen) == 1:
            return {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calculator",
                                                              "arguments": '{"expression": "583*94"}'}}]}
        return {"role": "assistant", "content": "54802"}
    assert calculator.play({"question": "q", "answer": "54802"}, ask) == 1.0
    assert seen[1][-1] == {"role": "tool", "tool_call_id": "c1", "content": "54802"}


class _Template:
    """A tokenizer as far as tool_format reads one: its chat template's text."""
    def __init__(self, template: str):
        self.chat_template = template


@pytest.mark.parametrize("template, fmt", [
    ("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}", "hermes"),
    ("{%- if tools %}<|start_header_id|>ipython<|end_header_id|>{% endif %}<|python_tag|>", "llama3_json"),
    ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "pythonic"),      # knows no tools
])
def test_the_call_format_is_read_from_the_chat_template_or_named(template, fmt):
    from actorjet.serving.tool_calls import tool_format

    assert tool_format(_Template(template)) == fmt
    assert tool_format(_Template(template), "mistral") == "mistral"     # the model entry's tool_parser wins


def test_each_format_parses_parallel_calls_in_openai_shape():
    from actorjet.serving.tool_calls import split_hermes, split_llama3_json, split_mistral

    hermes = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' \
             '<tool_call>{"name": "mul", "arguments": {"b": 2}}</tool_call>'
    llama = '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "mul", "parameters": {"b": 2}}'
    mistral = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "mul", "arguments": {"b": 2}}]'
    for split, text, rest in ((split_hermes, hermes, "Let me add."), (split_llama3_json, llama, None),
                              (split_mistral, mistral, None)):
        content, calls = split(text)
        assert content == rest, split
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
            [("add", {"a": 1}), ("mul", {"b": 2})], split
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    for split in (split_hermes, split_llama3_json, split_mistral):          # plain text stays text
        assert split("42, no tools needed") == ("42, no tools needed", [])
    assert split_mistral("[TOOL_CALLS] not json") == ("[TOOL_CALLS] not json", [])


NUMBERS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b", "a"]}}}]
TEXT = [{"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("fmt, choice, tools, opening", [
    ("hermes", "required", NUMBERS, "<tool_call>\n"),
    ("hermes", {"name": "add"}, NUMBERS, '<tool_call>\n{"name": "add", "arguments": {"b": '),
    ("hermes", {"name": "calc"}, TEXT, '<tool_call>\n{"name": "calc", "arguments": {"expression": "'),
    ("llama3_json", {"name": "add"}, NUMBERS, '{"name": "add", "parameters": {"b": '),
    ("mistral", "required", NUMBERS, '[TOOL_CALLS][{"name": "'),
    ("mistral", {"name": "calc"}, TEXT, '[TOOL_CALLS][{"name": "calc", "arguments": {"expression": "'),
    ("pythonic", {"name": "add"}, NUMBERS, "[add(b="),
    ("pythonic", {"name": "calc"}, TEXT, '[calc(expression="'),
    ("pythonic", {"name": "now"}, TEXT, "[now("),          # no arguments: the model closes the call
    ("pythonic", "none", TEXT, ""),
])
def test_tool_choice_writes_the_opening_of_a_call_in_the_models_format(fmt, choice, tools, opening):
    """Up to the first argument's value (the first required one, else the first property)."""
    from actorjet.serving.tool_choice import opening as write

    assert write(_Template("{{ tools }}"), choice, fmt, tools) == opening


def test_the_model_entry_names_a_tool_parser_or_gets_a_clear_error():
    from actorjet.config import normalize
    from actorjet.errors import UserError

    assert normalize({"models": [{"tool_parser": "llama3_json"}]})["models"][0]["tool_parser"] == "llama3_json"
    with pytest.raises(UserError, match="tool_parser must be hermes, llama3_json, mistral or pythonic"):
        normalize({"models": [{"tool_parser": "xml"}]})


def test_a_named_call_ends_where_its_format_closes_a_call():
    """The closing is a stop string of that generation only (serving/tool_choice.py says why)."""
    from actorjet.serving.tool_choice import closing

    template = _Template("{{ tools }}")
    assert closing(template, {"name": "add"}, "pythonic") == [")]"]
    assert closing(template, {"name": "add"}, "hermes") == ["</tool_call>"]
    assert closing(template, {"name": "add"}, "llama3_json") == []      # braces may nest: no string ends it
    assert closing(template, "required", "pythonic") == [] and closing(template, None, "hermes") == []
