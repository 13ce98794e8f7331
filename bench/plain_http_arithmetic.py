"""agents/arithmetic.py's behavior written against the HTTP API with the standard library.

The overhead benchmark runs both: the `openai` SDK costs ~1.4 ms of CPU per call on this
machine (~10x a plain `http.client` call), which is the agent's cost, not the framework's;
this behavior shows what the swarm itself adds."""
from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

from agents.arithmetic import eval_tasks, messages, score, tasks  # noqa: F401 - the same task source

def _connection(base_url: str) -> tuple[http.client.HTTPConnection, str]:
    """One keep-alive connection per episode thread, kept on the thread object (a
    module-level threading.local could not be pickled with the behavior)."""
    url = urlsplit(base_url)
    conns = threading.current_thread().__dict__.setdefault("actorjet_bench_conns", {})
    if url.netloc not in conns:
        conns[url.netloc] = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    return conns[url.netloc], url.path


def behavior(task: dict, llm) -> float:
    conn, path = _connection(llm.base_url())
    body = json.dumps({"model": llm.model(), "messages": messages(task), "max_tokens": 4, "temperature": 1.0})
    conn.request("POST", path + "/chat/completions", body,
                 {"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"gateway answered {response.status}: {reply}")
    return score(task, reply["choices"][0]["message"]["content"] or "")
