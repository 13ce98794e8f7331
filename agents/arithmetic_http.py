"""2-digit addition (the quickstart's task, agents/arithmetic.py) played by an agent that speaks
the gateway's HTTP API without the ``openai`` SDK, as an agent in another language or a
program with no SDK does: ``POST {base_url}/chat/completions`` with the episode's key as its
bearer token (here through ActorJet's own JSON client, runtime/http_json.py).

Why it ships: the SDK spends ~2 ms of CPU a call on 2 cores (request transforms, httpx,
response models: docs/writing-an-agent.md), a plain request about a tenth of that.  Where the
runners share the cores with the engine and the learner, that is CPU the training does not
get, so the swarm tests that train for many steps and are not about the SDK use this agent
(tests/jobs.py).  ``behavior`` is agents/arithmetic.py's; ``every_model`` asks every model of
the job the same question and rewards each for its own answer (``{model: score}``), so several
models, each with its own algorithm say, learn side by side from one task source.
"""
from __future__ import annotations

import time

from actorjet.runtime import http_json
from actorjet_agents.arithmetic import eval_tasks, messages, score, tasks  # noqa: F401  (this source's held-out set)

RETRIES = 6    # as the clients `llm.client()` returns (max_retries=6): an engine restarting answers 503,
               # a gateway restarting refuses connections for a moment


def chat(llm, model: str, chat_messages: list[dict], max_tokens: int) -> str:
    """One sampled chat completion's text.  ``http_json`` keeps one connection per thread and
    host (a request in one write) and reopens one the server closed while idle; a 503 or a
    gateway that cannot be reached is retried with the SDK's backoff (0.5 s, doubling, at
    most 8 s).  Any other error fails the call, as it fails the SDK's."""
    body = {"model": model, "messages": chat_messages, "max_tokens": max_tokens, "temperature": 1.0}
    for retry in range(RETRIES + 1):
        try:
            reply = http_json.post(llm.base_url(model) + "/chat/completions", body, token=llm.api_key, timeout=600)
            return reply["choices"][0]["message"]["content"] or ""
        except (http_json.HttpError, http_json.Unreachable) as e:
            if retry == RETRIES or (isinstance(e, http_json.HttpError) and e.status != 503):
                raise
            time.sleep(min(8.0, 0.5 * 2 ** retry))
    raise AssertionError("unreachable")


def behavior(task: dict, llm) -> float:
    return score(task, chat(llm, llm.model(), messages(task), 4))


def every_model(task: dict, llm) -> dict:
    return {model: score(task, chat(llm, model, messages(task), 4)) for model in llm.models()}
