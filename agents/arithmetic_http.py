"""2-digit addition (the quickstart's task, agents/arithmetic.py) played by an agent that speaks
the gateway's HTTP API with ``http.client`` instead of the ``openai`` SDK: what an agent
in another language, or a program with no SDK, does (``POST {base_url}/chat/completions``
with the episode's key as its bearer token).

Why it ships: the SDK spends ~2 ms of CPU a call on 2 cores (request transforms, httpx,
response models: docs/writing-an-agent.md), a plain request about a tenth of that.  Where the
runners share the cores with the engine and the learner, that is CPU the training does not
get, so the tests that train for many steps and are not about the SDK use this agent
(tests/test_algorithms_train.py).  ``behavior`` is agents/arithmetic.py's; ``every_model`` asks
every model of the job the same question and rewards each for its own answer (``{model:
score}``), so several models, each with its own algorithm say, learn side by side from one task
source.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from actorjet.runtime.endpoints import client_ssl
from actorjet.runtime.http_json import HTTPConnection, HTTPSConnection   # http.client's, a request in one write
from actorjet_agents.arithmetic import eval_tasks, messages, score, tasks  # noqa: F401  (this source's held-out set)

TRIES = 7      # as the SDK's clients in `llm.client()` (max_retries=6): a restarting engine answers 503 +
               # Retry-After, a restarting gateway refuses connections for a moment


def chat(llm, model: str, chat_messages: list[dict], max_tokens: int) -> str:
    """One sampled chat completion's text, on a keep-alive connection kept on the episode's
    thread (a behavior runs on one thread; a module-level threading.local could not be
    shipped with it)."""
    url = urlsplit(llm.base_url(model))
    body = json.dumps({"model": model, "messages": chat_messages, "max_tokens": max_tokens,
                       "temperature": 1.0}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"}
    conns = threading.current_thread().__dict__.setdefault("actorjet_http_conns", {})
    tries = 0
    while True:
        tries += 1
        conn, kept = conns.get(url.netloc), True
        if conn is None:
            conn, kept = (HTTPSConnection(url.hostname, url.port, timeout=600, context=client_ssl())
                          if url.scheme == "https" else HTTPConnection(url.hostname, url.port, timeout=600)), False
            conns[url.netloc] = conn
        try:
            conn.request("POST", url.path + "/chat/completions", body, headers)
            response = conn.getresponse()
            reply = response.read()
        except (ConnectionError, http.client.HTTPException):
            conns.pop(url.netloc).close()
            if tries == TRIES:
                raise
            if not kept:     # a kept connection the server closed while idle is retried at once;
                time.sleep(min(8.0, 0.5 * 2 ** (tries - 1)))    # a gateway that is down, with the SDK's backoff
            continue
        if response.status == 503 and tries < TRIES:
            try:
                wait_s = float(response.getheader("Retry-After") or 1)
            except ValueError:       # an HTTP date: wait a second
                wait_s = 1.0
            time.sleep(min(10.0, wait_s))
            continue
        data = json.loads(reply)
        if response.status != 200:
            raise RuntimeError(f"the gateway answered {response.status}: {data}")
        return data["choices"][0]["message"]["content"] or ""


def behavior(task: dict, llm) -> float:
    return score(task, chat(llm, llm.model(), messages(task), 4))


def every_model(task: dict, llm) -> dict:
    return {model: score(task, chat(llm, model, messages(task), 4)) for model in llm.models()}
