"""The Responses and Messages APIs on a real gateway and engine (tiny-arith), driven by the
official `openai` and `anthropic` SDKs: answers, streams, errors in each API's shape, and
calls recorded exactly like chat calls, so an episode's turns merge into one sequence."""
import anthropic
import openai
import pytest

from actorjet import signing
from gateways import tiny_gateway
from actorjet.rl.drift import repair_drift
from actorjet.rl.pack import pack

SECRET = "apis-secret"
TOOLS = [{"type": "function", "name": "add", "description": "add two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]

CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
CHAT_TURNS = [      # a tool call and its result, as chat completions sends them
    {"role": "user", "content": "add 2 and 3"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]


@pytest.fixture(scope="module")
def served():
    with tiny_gateway(SECRET) as both:
        yield both


def oai(server, episode):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, episode), max_retries=0)


def claude(server, episode, bearer=False):
    key = signing.mint_key(SECRET, episode)
    if bearer:
        return anthropic.Anthropic(base_url=server.url, auth_token=key, api_key=None, max_retries=0)
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def recorded(gw, episode):
    gw.store.flush()
    return gw.store.calls([episode])[episode]


def test_responses_round_trip_with_instructions_is_recorded_like_the_same_chat_call(served):
    gw, server = served
    r = oai(server, "resp1").responses.create(model="tiny", instructions="You add.", input="12+30=",
                                              max_output_tokens=4, temperature=0)
    assert r.status in ("completed", "incomplete") and isinstance(r.output_text, str)
    assert r.usage.output_tokens == len(recorded(gw, "resp1")[0]["completion_ids"]) <= 4
    oai(server, "chat1").chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": "You add."}, {"role": "user", "content": "12+30="}])
    (resp,), (chat,) = recorded(gw, "resp1"), recorded(gw, "chat1")
    assert resp["prompt_ids"] == chat["prompt_ids"] and resp["messages"] == chat["messages"]
    assert resp["completion_ids"] == chat["completion_ids"]           # greedy: the same answer


def test_responses_stream_has_the_documented_events_and_spells_the_answer(served):
    gw, server = served
    events = list(oai(server, "resp2").responses.create(model="tiny", input="40+2=", max_output_tokens=5,
                                                        stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text
    if text:
        assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
                "response.output_item.done"} <= set(kinds)
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_previous_response_id_continues_the_episode_and_its_turns_merge(served):
    gw, server = served
    client = oai(server, "resp3")
    first = client.responses.create(model="tiny", input="1+1=", max_output_tokens=3)
    second = client.responses.create(model="tiny", input="2+2=", max_output_tokens=3, previous_response_id=first.id)
    calls = recorded(gw, "resp3")
    assert [m["role"] for m in calls[1]["messages"]] == ["user", "assistant", "user"]
    assert calls[1]["messages"][1]["content"] == (first.output_text or None)
    assert second.previous_response_id == first.id
    pairs = [(c, 1.0) for c in calls]
    repair_drift(pairs, lambda ids: gw.tokenizer.decode(ids, skip_special_tokens=True))
    assert len(pack(pairs, "prefix")) == 1                             # one training sequence
    with pytest.raises(openai.BadRequestError) as other:
        oai(server, "resp4").responses.create(model="tiny", input="x", previous_response_id=first.id)
    assert other.value.body["param"] == "previous_response_id" and "another episode" in other.value.body["message"]
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="tiny", input="x", previous_response_id="resp_nope")
    assert "not known" in unknown.value.body["message"]


def test_responses_function_call_items_and_outputs_render_like_chat_tool_messages(served):
    gw, server = served
    items = [{"role": "user", "content": "add 2 and 3"},
             {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "5"}]
    oai(server, "resp5").responses.create(model="tiny", input=items, tools=TOOLS, max_output_tokens=3)
    oai(server, "chat5").chat.completions.create(model="tiny", max_tokens=3, tools=CHAT_TOOLS, messages=CHAT_TURNS)
    (resp,), (chat,) = recorded(gw, "resp5"), recorded(gw, "chat5")
    assert resp["prompt_ids"] == chat["prompt_ids"] and resp["tools"] == chat["tools"]


def test_a_named_tool_choice_writes_the_calls_opening_and_is_never_ignored(served):
    gw, server = served
    r = oai(server, "resp6").responses.create(model="tiny", input="add 2 and 3", tools=TOOLS, max_output_tokens=4,
                                              tool_choice={"type": "function", "name": "add"})
    (call,) = recorded(gw, "resp6")
    opening = gw.tokenizer("[add(a=", add_special_tokens=False)["input_ids"]     # pythonic: the template knows no tools
    assert call["prompt_ids"][-len(opening):] == opening
    said = [i for i in r.output if i.type == "function_call"] or [i for i in r.output if i.type == "message"]
    assert said                                                         # a call, or the text that failed to parse
    if said[0].type == "message":            # (tiny-arith's characters are digits and signs: its opening
        shown = gw.tokenizer.decode(opening, skip_special_tokens=True)    # decodes to what it knows)
        assert said[0].content[0].text.startswith(shown)
    with pytest.raises(openai.BadRequestError) as bad:
        oai(server, "resp6").responses.create(model="tiny", input="x", tools=TOOLS, tool_choice={"type": "function",
                                                                                               "name": "mul"})
    assert bad.value.body["param"] == "tool_choice"


def test_responses_bad_input_is_a_400_naming_the_field(served):
    gw, server = served
    client = oai(server, "resp7")
    for kwargs, field in (({"input": [{"type": "input_image"}]}, "input[0]"),
                          ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
                          ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
                          ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
                          ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
                           "input[0].content")):
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model="tiny", **kwargs)
        assert bad.value.body["param"] == field, (kwargs, bad.value.body)


def test_messages_round_trip_stream_and_bearer_auth_with_the_anthropic_sdk(served):
    gw, server = served
    msg = claude(server, "msg1").messages.create(model="tiny", max_tokens=4, system="You add.",
                                                  extra_body={"temperature": 0},     # (older SDKs' parameter)
                                                  messages=[{"role": "user", "content": "12+30="}])
    assert msg.role == "assistant" and msg.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    assert msg.usage.output_tokens == len(recorded(gw, "msg1")[0]["completion_ids"])
    oai(server, "chat1b").chat.completions.create(
        model="tiny", max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": "You add."}, {"role": "user", "content": "12+30="}])
    (got,), (chat,) = recorded(gw, "msg1"), recorded(gw, "chat1b")
    assert got["prompt_ids"] == chat["prompt_ids"] and got["completion_ids"] == chat["completion_ids"]
    with claude(server, "msg2", bearer=True).messages.stream(
            model="tiny", max_tokens=5, messages=[{"role": "user", "content": "40+2="}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens == len(recorded(gw, "msg2")[0]["completion_ids"])


def test_messages_tool_blocks_render_like_chat_and_errors_have_anthropics_shape(served):
    gw, server = served
    tools = [{"name": "add", "description": "add two numbers", "input_schema": TOOLS[0]["parameters"]}]
    claude(server, "msg3").messages.create(model="tiny", max_tokens=3, tools=tools, messages=[
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "5"}]}])
    oai(server, "chat3").chat.completions.create(model="tiny", max_tokens=3, tools=CHAT_TOOLS, messages=CHAT_TURNS)
    assert recorded(gw, "msg3")[0]["prompt_ids"] == recorded(gw, "chat3")[0]["prompt_ids"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude(server, "msg4").messages.create(model="tiny", max_tokens=4, extra_body={"temperature": 1.5},
                                               messages=[{"role": "user", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        anthropic.Anthropic(base_url=server.url, api_key="not-a-key", max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert denied.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        claude(server, "msg4").messages.create(model="other", max_tokens=4, messages=[{"role": "user", "content": "x"}])
