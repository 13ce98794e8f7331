"""The gateway against the real `openai` client and the real tiny model (no mocks)."""
import json

import urllib.error
import urllib.request
import openai
import pytest

from actorjet import signing
from actorjet.runner.llm import LLM

from actorjet.models import zoo
from actorjet.serving.transformers_engine import TransformersEngine
from actorjet.serving import render as render_module
from actorjet.serving.gateway_app import GatewayApp, local_backend
from actorjet.serving.serve import AppServer

SECRET = "test-secret"


def http(url, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served():
    engine = TransformersEngine(zoo.tiny_arith(0))
    gw = GatewayApp("tiny", engine.tokenizer, local_backend(engine), SECRET, engine.max_len)
    server = AppServer(gw.app())
    yield gw, server
    server.stop()
    engine.close()


def client(server, episode="e1", **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, episode), max_retries=0, **kw)


def test_chat_completion_is_recorded_with_tokens_and_logprobs(served):
    gw, server = served
    reply = client(server, "ep1").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "12+30="}], max_tokens=4, temperature=0)
    text = reply.choices[0].message.content
    assert reply.usage.prompt_tokens == 6 and reply.usage.completion_tokens >= 1
    calls = gw.store.calls(["ep1"])["ep1"]
    assert len(calls) == 1
    call = calls[0]
    assert call["prompt_ids"] == gw.tokenizer("12+30=")["input_ids"]
    assert gw.tokenizer.decode(call["completion_ids"], skip_special_tokens=True).startswith(text)
    assert len(call["logprobs"]) == len(call["completion_ids"]) and all(lp <= 0 for lp in call["logprobs"])
    assert call["role"] == "default" and call["weight_version"] == 0


def test_n_seed_stop_and_role_header(served):
    gw, server = served
    c = client(server, "ep2", default_headers={"X-ActorJet-Role": "solver"})
    a = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "45+45="}],
                                  n=4, seed=7, max_tokens=4, temperature=1.0)
    b = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "45+45="}],
                                  n=4, seed=7, max_tokens=4, temperature=1.0)
    assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]
    assert len(a.choices) == 4
    calls = gw.store.calls(["ep2"])["ep2"]
    assert len(calls) == 8 and {c["role"] for c in calls} == {"solver"}
    s = client(server, "ep2b").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "45+45="}], max_tokens=4, temperature=0, stop=["0"])
    assert "0" not in s.choices[0].message.content


def test_streaming_replays_the_recorded_answer(served):
    gw, server = served
    c = client(server, "ep3")
    plain = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "33+44="}],
                                      max_tokens=4, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "33+44="}],
                                            max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens >= 1
    assert len(gw.store.calls(["ep3"])["ep3"]) == 2


def test_multi_turn_conversation_runs_unchanged(served):
    gw, server = served
    c = client(server, "ep4")
    history = [{"role": "user", "content": "10+10="}]
    for turn in range(3):
        reply = c.chat.completions.create(model="tiny", messages=history, max_tokens=3, temperature=0)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"{turn}+1="}]
    assert len(gw.store.calls(["ep4"])["ep4"]) == 3


def test_completions_and_models_endpoints(served):
    gw, server = served
    c = client(server, "ep5")
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.completions.create(model="tiny", prompt="20+22=", max_tokens=3, temperature=0)
    assert r.choices[0].text and r.usage.prompt_tokens == 6


@pytest.mark.parametrize("kwargs,status,code_or_param", [
    (dict(model="nope", messages=[{"role": "user", "content": "1+1="}]), 404, "model_not_found"),
    (dict(model="tiny", messages=[]), 400, "messages"),
    (dict(model="tiny", messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}], temperature=5), 400, "temperature"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}], n=0), 400, "n"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1" * 400}]), 400, "context_length_exceeded"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=10_000), 400, "max_tokens"),
    # tools the gateway must write into the prompt (tiny-arith's template knows none): a 400, not a 500
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}],
          tools=[{"type": "function", "function": {"name": 5}}]), 400, "tools"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}],
          tools=[{"type": "function", "function": {"name": "f", "parameters": ["x"]}}]), 400,
     "tools[0].function.parameters"),
    (dict(model="tiny", messages=[{"role": "user", "content": "1+1="}],
          tools=[{"type": "function", "function": {"name": "f", "parameters": {"properties": "x"}}}]), 400,
     "tools[0].function.parameters"),
])
def test_client_mistakes_are_openai_shaped_4xx(served, kwargs, status, code_or_param):
    _, server = served
    with pytest.raises(openai.APIStatusError) as err:
        client(server, "ep6").chat.completions.create(**kwargs)
    assert err.value.status_code == status
    body = err.value.body
    assert code_or_param in (body.get("code"), body.get("param"))
    assert body.get("message")


def test_keys_closed_episodes_and_raw_http_errors(served):
    gw, server = served
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-not-ours", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}])
    forged = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key("other-secret", "e9"), max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        forged.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}])
    gw.store.close(["ep7"])          # the registry closed it (failed, expired or aborted)
    with pytest.raises(openai.ConflictError):
        client(server, "ep7").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}])
    status, body = http(server.url + "/v1/chat/completions", raw=b"{not json",
                        headers={"Authorization": f"Bearer {signing.mint_key(SECRET, 'ep8')}"})
    assert status == 400 and body["error"]["message"]
    status, body = http(server.url + "/v1/actorjet/results", {"group": {"group_id": "g1", "size": 1},
                                                             "episodes": [{"episode_id": "g1.0", "api_key": "sk-x",
                                                                           "member": 0, "reward": 1.0}]})
    assert status == 403 and "api_key" in body["error"]["message"]      # a reward needs its episode's key
    for leased_at in (float("nan"), 1e300, -5, "yesterday", True, [1]):   # the step timeline's lease time
        episode = {"episode_id": "g1.0", "api_key": signing.mint_key(SECRET, "g1.0"), "member": 0, "reward": 1.0,
                   "leased_at": leased_at}
        status, body = http(server.url + "/v1/actorjet/results", raw=json.dumps(
            {"group": {"group_id": "g1", "size": 1}, "episodes": [episode]}).encode())
        assert status == 400 and "leased_at" in body["error"]["message"], (leased_at, body)
    status, body = http(server.url + "/v1/chat/completions", raw=b" " * (17 * 1024 * 1024),   # over 16 MiB
                        headers={"Authorization": f"Bearer {signing.mint_key(SECRET, 'ep8')}"})
    assert status == 413 and "too large" in body["error"]["message"].lower(), body
    assert http(server.url + "/healthz")[1]["ok"] is True


def test_tool_calls_are_parsed_in_the_openai_shape():
    from actorjet.serving.tool_calls import split_hermes

    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = split_hermes(text)
    assert content == "Let me add."
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert split_hermes("no tools here") == ("no tools here", [])
    assert split_hermes("<tool_call>{broken</tool_call>")[1] == []


def test_tools_are_accepted_and_recorded(served):
    gw, server = served
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    reply = client(server, "ep9").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "1+1="}], tools=tools, max_tokens=3, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert gw.store.calls(["ep9"])["ep9"][0]["tools"] == tools
    with pytest.raises(openai.BadRequestError):
        client(server, "ep10").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+1="}], tools=[{"type": "function"}])


def test_engine_client_sends_concurrent_requests_together_and_never_leaves_one_waiting():
    """The gateway's engine client: requests of one event-loop turn travel in one POST, each
    gets its own answer; an engine that drops the connection fails them all with a retryable
    EngineUnavailable instead of leaving them waiting."""
    import asyncio

    from aiohttp import web

    from actorjet.serving.batching_engine import GenRequest
    from actorjet.serving.engine_wire import engine_app
    from actorjet.serving.gateway_app import EngineUnavailable
    from actorjet.serving.engine_client import HttpEngineBackend

    engine = TransformersEngine(zoo.tiny_arith(0), seed=0)
    app = engine_app(engine)
    posts = []
    app.middlewares.append(web.middleware(lambda request, handler: posts.append(1) or handler(request)))
    server = AppServer(app)

    async def drop(reader, writer):
        await reader.read(100)
        writer.close()

    async def scenario():
        backend = HttpEngineBackend()
        backend.url = server.url
        prompts = [[5 + k % 10, 6, 7] for k in range(12)]
        answers = await asyncio.gather(*(backend(GenRequest(p, 3, 0.0)) for p in prompts))
        dropper = await asyncio.start_server(drop, "127.0.0.1", 0)
        backend.url = f"http://127.0.0.1:{dropper.sockets[0].getsockname()[1]}"
        failures = await asyncio.wait_for(asyncio.gather(*(backend(GenRequest(p, 3, 0.0)) for p in prompts[:3]),
                                                         return_exceptions=True), 30)
        dropper.close()
        await backend.session.close()
        return answers, failures

    try:
        answers, failures = asyncio.run(scenario())
    finally:
        server.stop()
        engine.close()
    assert len(posts) == 1                                   # twelve requests, one round trip
    assert [len(a) for a in answers] == [1] * 12
    assert answers[0][0].completion_ids == answers[10][0].completion_ids    # same prompt, greedy
    assert all(isinstance(f, EngineUnavailable) for f in failures), failures


def test_a_repeated_conversation_reuses_its_rendered_prompt_and_only_its_own(served):
    """A GRPO group sends one conversation 8 times; the gateway renders it once.  The reuse
    must never hand one conversation's prompt to another, nor let a caller change it."""
    gw, server = served
    c = client(server, "ep_cache")
    for question in ("12+30=", "12+31=", "12+30=", "12+31="):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}], max_tokens=2)
    ids = [call["prompt_ids"] for call in gw.store.calls(["ep_cache"])["ep_cache"]]
    assert ids[0] == ids[2] == gw.tokenizer("12+30=")["input_ids"]
    assert ids[1] == ids[3] == gw.tokenizer("12+31=")["input_ids"]
    gw._render("x", "default", [{"role": "user", "content": "12+30="}], None).append(0)   # a caller's change stays its own
    assert list(gw._render("y", "default", [{"role": "user", "content": "12+30="}], None)) == ids[0]


def test_the_rendered_prompts_kept_stay_within_their_budget(served, monkeypatch):
    """Long multi-turn conversations must not pile up: the cache is bounded by size."""
    gw, _ = served
    monkeypatch.setattr(render_module, "FIRST_CACHE", 400)
    cache = gw.renderer
    for i in range(40):
        gw._render(f"b{i}", "default", [{"role": "user", "content": f"{i:02d}+" + "1" * 40}], None)
    assert 0 < cache.first_size <= 400
    assert cache.first_size == sum(len(k) + len(v[1]) for k, v in cache.first.items())
    huge = [{"role": "user", "content": "9" * 500}]          # alone over the budget: rendered, not kept
    assert list(gw._render("h", "default", huge, None)) == gw.tokenizer("9" * 500)["input_ids"]
    assert cache.first_size <= 400


def runner_client(server, episode: str):
    """What a behavior gets from ``llm.client()``: the SDK over runner/llm.py."""
    return LLM({"tiny": server.url + "/v1"}, signing.mint_key(SECRET, episode), episode).client()


def test_a_runners_client_answers_and_streams_over_its_lean_transport(served):
    gw, server = served
    c = runner_client(server, "t1")
    messages = [{"role": "user", "content": "33+44="}]
    plain = c.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens >= 1
    for _ in range(3):     # the same kept-alive connection, after a stream was read to its end
        again = c.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
        assert again.choices[0].message.content == plain.choices[0].message.content
    assert len(gw.store.calls(["t1"])["t1"]) == 5


def test_gateway_errors_reach_a_runners_client_as_the_sdk_raises_them(served):
    _, server = served
    c = runner_client(server, "t2")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=-3)
    bad = LLM({"tiny": server.url + "/v1"}, "not-a-key").client()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    ok = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    assert ok.choices[0].message.content is not None       # the connection survived the errors


def test_an_ended_or_closed_episode_is_refused_with_its_cause(served):
    """issue 30: no call is ever recorded after an episode's reward (409), and a closed key's
    409 says why it was closed."""
    gw, server = served
    c = client(server, "gend.0")
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    status, body = http(server.url + "/v1/actorjet/results", {
        "group": {"group_id": "gend", "size": 1, "task_name": "t", "behavior": "b", "version": 1},
        "episodes": [{"episode_id": "gend.0", "member": 0, "reward": 1.0, "api_key": signing.mint_key(SECRET, "gend.0")}]},
        {"Authorization": f"Bearer {SECRET}"})
    assert status == 200 and body["stored"] == 1
    with pytest.raises(openai.APIStatusError) as refused:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    assert refused.value.status_code == 409 and "reward is stored" in str(refused.value)
    assert len(gw.store.calls(["gend.0"])["gend.0"]) == 1                   # the late call left nothing
    assert http(server.url + "/v1/actorjet/results", {                      # the result again: idempotent
        "group": {"group_id": "gend", "size": 1, "task_name": "t", "behavior": "b", "version": 1},
        "episodes": [{"episode_id": "gend.0", "member": 0, "reward": 1.0, "api_key": signing.mint_key(SECRET, "gend.0")}]},
        {"Authorization": f"Bearer {SECRET}"})[1]["refused"] == []
    gw.store.close(["ep_gone"], "lease expired (idle): no LLM call for 120 s ([train] lease_timeout_s)")
    with pytest.raises(openai.APIStatusError) as refused:
        client(server, "ep_gone").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1"}])
    assert refused.value.status_code == 409 and "no LLM call for 120 s" in str(refused.value)


def test_a_client_whose_end_answer_was_lost_retries_into_success_not_a_409(served):
    """CI once failed a client-mode episode: its ``end`` landed, the answer was lost under load,
    and the retry met 409 "it ended: its reward is stored".  A proxy that forwards the first
    ``end`` to the real gateway and drops the answer replays it; a first-try 409 stays an error."""
    import http.server
    import threading
    from actorjet.errors import UserError
    from actorjet.runner.client import Client
    _, server = served
    forwarded = []

    class LossyProxy(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            req = urllib.request.Request(server.url + self.path, data=body, headers=dict(self.headers))
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, answer = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, answer = e.code, e.read()
            forwarded.append((self.path, status))
            if self.path.endswith("/end") and len([p for p, _ in forwarded if p.endswith("/end")]) == 1:
                self.close_connection = True          # the answer is lost on the way back
                return
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LossyProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{proxy.server_port}", SECRET).episode() as ep:
            ep.reward = 1.0
        ends = [status for path, status in forwarded if path.endswith("/end")]
        assert ends == [200, 409], forwarded                   # it landed, and the retry met the 409
        with pytest.raises(UserError, match="reward is stored"):   # ending it again on purpose: an error
            with Client(server.url, SECRET).episode() as again:
                again.episode_id, again.api_key = ep.episode_id, ep.api_key
                again.reward = 1.0
    finally:
        proxy.shutdown()
        proxy.server_close()
