"""One bad input never stops training or hurts anyone else (issue: no poison pills).

The gateway's HTTP surface is fuzzed with hypothesis against the real tiny model; a request
that poisons an engine batch costs only itself; bad rewards are refused at the edge and bad
data deeper down is quarantined while training goes on; ended, aborted and expired episodes
free their calls and refuse their keys."""
import asyncio
import json
import sqlite3
import urllib.error
import urllib.request

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorjet import signing

from actorjet.models import zoo
from actorjet.serving.batching_engine import RequestFailed
from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
from actorjet.serving.engine_wire import engine_app
from actorjet.serving.gateway_app import GatewayApp, local_backend
from actorjet.serving.engine_client import HttpEngineBackend
from actorjet.serving.openai_api import ApiError
from actorjet.store.episode_store import EpisodeStore
from actorjet.store.records import CallRecord, Tails, encode
from actorjet.serving.serve import AppServer
from actorjet.rl.rewards import bad_reward
from swarm import REPO, wait_until

SECRET = "poison-secret"


def http(url, body=None, headers=None, raw=None, method="POST"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                return r.status, {"events": r.read().decode()}         # a stream that succeeded
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())      # every error is JSON: this raises if it is not


@pytest.fixture(scope="module")
def engine():
    e = TransformersEngine(zoo.tiny_arith(0))
    yield e
    e.close()


@pytest.fixture(scope="module")
def served(engine):
    gw = GatewayApp("tiny", engine.tokenizer, local_backend(engine), SECRET, engine.max_len, default_max_tokens=4)
    server = AppServer(gw.app())
    yield gw, server
    server.stop()


# -- fuzzing the HTTP surface -----------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
    | st.sampled_from(["true", "false", "1e309", "-1", "tiny", "user", "NaN"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
FIELDS = ["model", "messages", "prompt", "temperature", "top_p", "n", "max_tokens", "max_completion_tokens",
          "stop", "seed", "stream", "logprobs", "top_logprobs", "stream_options", "tools", "tool_choice",
          "reward", "task", "group", "group_size", "episodes", "presence_penalty", "user", "response_format",
          "input", "instructions", "max_output_tokens", "previous_response_id", "text", "store", "system",
          "stop_sequences", "metadata"]
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "bot"]) | json_values,
                                 "content": st.text(max_size=12) | json_values})
bodies = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
    st.fixed_dictionaries({"model": st.just("tiny"), "messages": st.lists(message, max_size=3)},
                          optional={k: json_values for k in ("temperature", "top_p", "n", "max_tokens", "stop",
                                                             "seed", "stream", "logprobs", "top_logprobs")}),
    st.fixed_dictionaries({"model": st.just("tiny"), "prompt": st.text(max_size=12)},
                          optional={k: json_values for k in ("temperature", "n", "max_tokens", "stop", "seed")}))
item = st.one_of(                                  # Responses input items and Messages content blocks
    message,
    st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning",
                                                    "text", "tool_use", "tool_result", "image"]) | json_values},
                          optional={k: json_values | st.text(max_size=8) for k in
                                    ("role", "content", "call_id", "name", "arguments", "output", "text", "id",
                                     "input", "tool_use_id", "is_error")}))
bodies = bodies | st.fixed_dictionaries(
    {"model": st.just("tiny"), "input": st.text(max_size=12) | st.lists(item, max_size=3)},
    optional={k: json_values for k in ("instructions", "max_output_tokens", "temperature", "tools", "tool_choice",
                                       "previous_response_id", "stream", "text")}) | st.fixed_dictionaries(
    {"model": st.just("tiny"), "max_tokens": st.integers(-1, 8) | json_values,
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]) | json_values,
                                                 "content": st.text(max_size=8) | st.lists(item, max_size=3)}),
                          max_size=3)},
    optional={k: json_values for k in ("system", "temperature", "tools", "tool_choice", "stop_sequences", "stream")})
raw_bodies = st.binary(max_size=64) | st.sampled_from([b"", b"{", b"\xff\xfe", b'{"a":' * 300, b"[" * 5000,
                                                       b'{"model": "tiny", "messages": [{"role": "user", "content": NaN}]}'])
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/actorjet/episodes", "/v1/actorjet/episodes/EP/end",
         "/v1/actorjet/episodes/EP/abort", "/v1/actorjet/results", "/v1/responses", "/v1/messages"]


def _check(status, body, path=""):
    assert status < 500, (status, body)
    if status >= 400 and path == "/v1/messages":          # Anthropic's error shape on its route
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    elif status >= 400:
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), body=bodies, raw=st.none() | raw_bodies, auth=st.sampled_from(["episode", "cluster", "junk"]))
def test_any_body_gets_json_4xx_or_success_never_5xx(served, path, body, raw, auth):
    gw, server = served
    episode = "fuzz1"
    token = {"episode": signing.mint_key(SECRET, episode), "cluster": SECRET, "junk": "x" * 40}[auth]
    status, answer = http(server.url + path.replace("EP", episode), body, {"Authorization": f"Bearer {token}"},
                          raw=raw if raw is not None else (json.dumps(body, allow_nan=True).encode()))
    _check(status, answer, path)


def test_a_valid_request_succeeds_after_the_fuzzing_and_errors_are_openai_shaped(served):
    gw, server = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "after"), max_retries=0)
    reply = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "12+30="}], max_tokens=4)
    assert reply.choices[0].message.content is not None
    for bad, field in (({"stream": "false"}, "stream"), ({"logprobs": "true"}, "logprobs"),
                       ({"temperature": 1e309}, "temperature"), ({"n": True}, "n"),
                       ({"messages": [{"role": "user", "content": ""}]}, "messages")):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "1+1="}], **bad}
        status, answer = http(server.url + "/v1/chat/completions", body,
                              {"Authorization": f"Bearer {signing.mint_key(SECRET, 'after')}"})
        assert status == 400 and answer["error"]["param"] == field, (bad, answer)
    status, answer = http(server.url + "/v1/nowhere", {}, method="GET")
    assert status == 404 and answer["error"]["message"]
    status, answer = http(server.url + "/v1/models/tiny", method="GET")
    assert status == 200 and answer["id"] == "tiny"
    status, answer = http(server.url + "/v1/models/other", method="GET")
    assert status == 404 and answer["error"]["code"] == "model_not_found"


def test_tiny_temperature_is_sampled_greedily_not_a_poison(served):
    gw, server = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "cold"), max_retries=0)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "12+30="}], max_tokens=4)
    assert (c.chat.completions.create(temperature=1e-30, **kw).choices[0].message.content
            == c.chat.completions.create(temperature=0, **kw).choices[0].message.content)


def test_logprobs_spell_the_content_with_alternatives(served):
    gw, server = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key(SECRET, "lp"), max_retries=0)
    reply = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "23+45="}], max_tokens=6,
                                      logprobs=True, top_logprobs=3, stop=["\n"])
    choice = reply.choices[0]
    tokens = choice.logprobs.content
    assert "".join(t.token for t in tokens) == choice.message.content
    for t in tokens:
        assert len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        assert max(a.logprob for a in t.top_logprobs) >= t.logprob - 1e-6      # the best alternative is listed
        assert sorted((a.logprob for a in t.top_logprobs), reverse=True) == [a.logprob for a in t.top_logprobs]


# -- one request's blast radius ------------------------------------------------------------------
def test_a_batch_poisoning_request_fails_alone_with_a_400(engine):
    """Real engine behind its real HTTP endpoint, called as the gateway calls it: 16 valid
    requests and one that makes sampling fail (a temperature the gateway never lets through),
    all in one engine batch."""
    server = AppServer(engine_app(engine))
    backend = HttpEngineBackend()
    backend.url = server.url
    prompt = engine.tokenizer("12+30=", add_special_tokens=False)["input_ids"]

    async def run():
        reqs = [GenRequest(prompt, 4, 1.0, seed=i) for i in range(16)] + [GenRequest(prompt, 4, 1e-38)]
        outcomes = await asyncio.gather(*(backend(r) for r in reqs), return_exceptions=True)
        await backend.session.close()
        return outcomes
    try:
        outcomes = asyncio.run(run())
    finally:
        server.stop()
    good, poison = outcomes[:16], outcomes[16]
    assert all(isinstance(o, list) and len(o[0].completion_ids) >= 1 for o in good), good
    assert isinstance(poison, ApiError) and poison.status == 400, poison
    assert engine.isolated >= 1


def test_the_engine_blames_itself_when_nothing_works(engine):
    """If every request fails alone and the engine has not worked lately, the error stays
    the engine's (a retryable 503 at the gateway), not the requests'."""
    from concurrent.futures import Future
    futures = [(GenRequest([5, 6], 4, 1e-38), Future()) for _ in range(3)]     # sampling fails for each
    saved, engine.last_success = engine.last_success, 0.0
    try:
        engine._isolate(futures, RuntimeError("batch failed"))
    finally:
        engine.last_success = saved
    assert all(not isinstance(f.exception(), RequestFailed) for _, f in futures)


# -- rewards ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reward", [float("nan"), float("inf"), "1.0", {"a": {"b": 1}}, {"a": float("nan")}, True,
                                    None, [], {}, {"": 1.0}])
def test_bad_rewards_are_named(reward):
    assert bad_reward(reward).startswith("invalid reward")


@pytest.mark.parametrize("reward", [0, 1.0, -3.5, {"proposer": 1.0, "verifier": 0}])
def test_good_rewards_pass(reward):
    assert bad_reward(reward) == ""


# -- a live swarm: poison rewards, quarantine, episode lifecycle --------------------------------------
JOB = """
[[models]]
name = "policy"
source = "tiny-arith"
eval_every = 1000
checkpoint_every = 1000
[[tasks]]
name = "arithmetic"
source = "agents.arithmetic"
behavior = "agents.flaky_arithmetic:behavior"
[train]
group_size = 4
groups_per_step = 4
steps = 14
lease_timeout_s = 3.0
runner_concurrency = 8
"""


@pytest.mark.slow
def test_poison_is_refused_or_quarantined_training_goes_on_and_ended_episodes_hold_nothing(swarm, tmp_path):
    from actorjet.runtime.head import attach_root, status as head_status

    swarm.env.update(AJ_FLAKY_RAISE="0.1", AJ_FLAKY_HANG="0", AJ_FLAKY_EXIT="0")     # failed episodes too
    (tmp_path / "job.toml").write_text(JOB)
    run = tmp_path / "run"
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                                extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    step = lambda: status()["models"][0]["learner_step"]  # noqa: E731
    wait_until(lambda: step() >= 2, 120, interval_s=0.5, what="2 learner steps")
    base = status()["services"]["policy"]["gateway"].removesuffix("/v1")

    def open_episode():
        code, info = http(base + "/v1/actorjet/episodes", {"group_size": 1}, {"Authorization": f"Bearer {token}"})
        assert code == 200, info
        llm = openai.OpenAI(base_url=base + "/v1", api_key=info["api_key"], max_retries=0)
        llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": "11+11="}], max_tokens=4)
        return info, llm

    # 1. poison rewards are refused at the edge with a 400 naming the field; the key still works
    info, llm = open_episode()
    end = f"{base}/v1/actorjet/episodes/{info['episode_id']}/end"
    auth = {"Authorization": f"Bearer {info['api_key']}"}
    for poison in (float("nan"), float("inf"), "1.0", {"policy": {"x": 1}}, {"policy": float("nan")}, True):
        code, answer = http(end, raw=json.dumps({"reward": poison}, allow_nan=True).encode(), headers=auth)
        assert code == 400 and answer["error"]["param"] == "reward", (poison, answer)
    assert http(end, {"reward": 1.0}, auth)[0] == 200

    # 2. poison deeper down (a group stored before rewards were checked): quarantined, training goes on
    db = sqlite3.connect(run / "episodes-policy.sqlite", timeout=30)
    def call(episode_id):       # a row as the gateway writes it (store/records.py)
        return encode(CallRecord(episode_id, "policy", "default", 0, 0, [5, 6], [7], [-0.1], 0, 1.0), Tails())
    with db:
        db.execute("INSERT INTO groups (group_id, task_name, behavior, version, size, complete_at) "
                   "VALUES ('poison-1', 'arithmetic', 'arithmetic', 1, 2, 0)")
        for k, reward in enumerate(("high", 0.0)):
            db.execute("INSERT INTO episodes (episode_id, group_id, member, reward, stored_at) VALUES (?, 'poison-1', ?, ?, 0)",
                       (f"poison-1.{k}", str(k), json.dumps(reward)))
            row = call(f"poison-1.{k}")
            db.execute(f"INSERT INTO calls VALUES ({','.join('?' * len(row))})", row)
    before = step()
    wait_until(lambda: status()["groups"]["quarantined"] >= 1, 60, what="the poisoned group quarantined")
    wait_until(lambda: step() >= before + 3, 120, interval_s=0.5, what="3 more learner steps")
    (cause,) = db.execute("SELECT quarantine FROM groups WHERE group_id = 'poison-1'").fetchone()
    assert "invalid reward" in json.loads(cause)["cause"]
    assert status()["restarts"].get("root/model.policy/learner", 0) == 0   # no crash, so no crash loop

    # 3. an aborted episode's key is refused at once; an expired one (never ended) after lease_timeout_s
    info, llm = open_episode()
    http(f"{base}/v1/actorjet/episodes/{info['episode_id']}/abort", {}, {"Authorization": f"Bearer {info['api_key']}"})
    with pytest.raises(openai.APIStatusError) as refused:
        llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    assert refused.value.status_code == 409
    info, llm = open_episode()
    wait_until(lambda: status()["aborted_by_cause"].get("client expired (idle)") == 1, 20,
               what="the idle episode expired")

    def refusal():      # the registry counts the expiry first, then tells the gateways (CloseEpisodes)
        try:
            llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
        except openai.APIStatusError as e:
            return e
    refused = wait_until(refusal, 10, interval_s=0.2, what="the gateway to refuse the expired episode's key")
    assert refused.status_code == 409 and "no LLM call for" in str(refused)     # it says why

    # 4. when the swarm is quiet, the gateway holds nothing in memory for any episode: finished
    #    ones are in the store, failed, aborted and expired ones closed
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="14 learner steps")
    wait_until(lambda: status()["groups"]["leases_open"] == 0, 60, what="no lease open")
    assert status()["aborted_by_cause"].get("behavior error", 0) > 0           # failed episodes happened
    # nothing else lost: every group the registry leased to the end is complete in the store
    # (plus the planted poison, which no lease issued), each trained, pending or quarantined;
    # status's finished is the store's own count (StoreNews)
    counts = EpisodeStore(run / "episodes-policy.sqlite").counts()      # retired groups included
    g = wait_until(lambda: (lambda g: g if g["finished"] == counts["complete"] else None)(status()["groups"]), 10,
                   what="status's finished groups to be the store's")
    assert g["finished"] - 1 <= g["issued"] and counts["quarantined"] == 1
    assert counts["trained"] > 0
    wait_until(lambda: http(base + "/healthz", method="GET")[1]["open_episodes"] == 0, 30,
               what="no recorded calls left in the gateway")
