"""What a behavior receives as ``llm``: where each model is, and ready `openai` clients.

    def behavior(task, llm):
        reply = llm.client().chat.completions.create(model=llm.model(), messages=[...])
        judge = llm.client("judge", role="verifier")      # another model, another role
        ...

One key serves every model and role of the episode; the role travels in the
``X-ActorJet-Role`` header so the learner can credit each role's calls separately.
The clients retry 503s from a restarting engine (honouring Retry-After).
"""
from __future__ import annotations

import threading

import openai

from actorjet.runner.transport import LeanTransport
from actorjet.runtime import endpoints

_shared = threading.local()


def _base_client(base_url: str, role: str) -> openai.OpenAI:
    """One HTTP connection pool per (thread, model, role): creating clients is not free."""
    cache = getattr(_shared, "clients", None)
    if cache is None:
        cache = _shared.clients = {}
    key = (base_url, role)
    if key not in cache:
        trust = endpoints.client_ssl() if base_url.startswith("https:") else None   # a self-signed gateway
        http = openai.DefaultHttpxClient(transport=LeanTransport(trust))
        cache[key] = openai.OpenAI(base_url=base_url, api_key="unset", max_retries=6, timeout=600,
                                   default_headers={"X-ActorJet-Role": role}, http_client=http)
    return cache[key]


class LLM:
    def __init__(self, urls: dict[str, str], api_key: str, episode_id: str = ""):
        if not urls:
            raise ValueError("no model is being served")
        self.urls, self.api_key, self.episode_id = dict(urls), api_key, episode_id
        self.default = next(iter(self.urls))

    def models(self) -> list[str]:
        return list(self.urls)

    def model(self, name: str | None = None) -> str:
        """The model name to pass as ``model=`` (the first model when none is named)."""
        name = name or self.default
        if name not in self.urls:
            raise KeyError(f"no model {name!r} in this swarm (models: {', '.join(self.urls)})")
        return name

    def base_url(self, name: str | None = None) -> str:
        return self.urls[self.model(name)]

    def client(self, name: str | None = None, role: str = "default") -> openai.OpenAI:
        return _base_client(self.base_url(name), role).with_options(api_key=self.api_key)
