"""The overhead benchmark's behaviors written against the HTTP API with the standard library.

The same tasks, prompts and scores as agents/arithmetic.py and bench/digits_task.py.  The
`openai` SDK costs ~1.4 ms of CPU per call on this machine (~10x a plain `http.client`
call: request transforms, httpx, response models).  That is the agent's own cost, not the
swarm's; running both shows what each adds."""
from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import digits_task
from actorjet_agents import arithmetic as arithmetic_task


def _chat(llm, messages: list[dict], max_tokens: int) -> str:
    """One chat completion over a keep-alive connection kept on the episode's thread (a
    module-level threading.local could not travel with the pickled behavior)."""
    url = urlsplit(llm.base_url())
    conns = threading.current_thread().__dict__.setdefault("actorjet_bench_conns", {})
    if url.netloc not in conns:
        conns[url.netloc] = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    conn = conns[url.netloc]
    body = json.dumps({"model": llm.model(), "messages": messages, "max_tokens": max_tokens,
                       "temperature": 1.0})
    conn.request("POST", url.path + "/chat/completions", body,
                 {"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"gateway answered {response.status}: {reply}")
    return reply["choices"][0]["message"]["content"] or ""


def arithmetic(task: dict, llm) -> float:
    return arithmetic_task.score(task, _chat(llm, arithmetic_task.messages(task), 4))


def digits(task: dict, llm) -> float:
    return digits_task.score(task, _chat(llm, digits_task.messages(task), digits_task.MAX_TOKENS))
