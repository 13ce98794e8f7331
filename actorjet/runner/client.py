"""Client mode: drive episodes from your own loop instead of pulling leases.

    import actorjet
    swarm = actorjet.connect("http://127.0.0.1:8400", token=TOKEN)   # any model's gateway
    with swarm.episode(task={"q": "07+45="}, group="q17", group_size=8) as ep:
        reply = ep.client().chat.completions.create(model=ep.model(), messages=[...])
        ep.reward = 1.0

Leaving the block without a reward, or with an exception, aborts the episode (nothing is
trained on it).  Episodes that share ``group`` are normalized together (GRPO) once
``group_size`` of them have ended.
"""
from __future__ import annotations

import os
import time

from actorjet.errors import UserError
from actorjet.runner.llm import LLM
from actorjet.runtime import http_json
from actorjet.store.episode_store import ENDED


RETRY_S = 60.0     # a gateway that restarts comes back on the same URL within seconds


def _post(url: str, key: str, body: dict, retry_s: float = RETRY_S, done_if: str = "") -> dict:
    """POST with retries while the gateway is unreachable or answers a retryable 503 (it
    restarts on the same URL); any other error is final and names the gateway's reason.
    ``done_if``: the refusal a retry meets when an earlier try landed but its answer was lost
    (an episode's ``end``: "it ended: its reward is stored") — that retry succeeded."""
    deadline, wait, tried = time.monotonic() + retry_s, 0.2, False
    while True:
        try:
            return http_json.post(url, body, key)
        except http_json.HttpError as e:
            if (tried or e.resent) and done_if and e.status == 409 and done_if in e.message:
                return {"ok": True}
            if e.status != 503 or time.monotonic() > deadline:
                raise UserError(str(e)) from None
        except http_json.Unreachable as e:
            if time.monotonic() > deadline:
                raise UserError(str(e)) from None
        tried = True
        time.sleep(wait)
        wait = min(wait * 2, 2.0)


class Episode:
    def __init__(self, client: "Client", task=None, group: str | None = None, group_size: int = 1):
        self._client, self.task, self.group, self.group_size = client, task, group, group_size
        self.reward = None
        self.episode_id = self.api_key = None
        self.llm: LLM | None = None

    def __enter__(self) -> "Episode":
        info = _post(self._client.url + "/v1/actorjet/episodes", self._client.token,
                     {"task": self.task, "group": self.group, "group_size": self.group_size})
        self.episode_id, self.api_key = info["episode_id"], info["api_key"]
        urls = info.get("base_urls") or {info["model"]: self._client.url + "/v1"}
        self.llm = LLM(urls, self.api_key, self.episode_id)
        return self

    def client(self, model: str | None = None, role: str = "default"):
        return self.llm.client(model, role)

    def model(self, name: str | None = None) -> str:
        return self.llm.model(name)

    def __exit__(self, exc_type, exc, tb) -> bool:
        verb = "end" if exc_type is None and self.reward is not None else "abort"
        _post(f"{self._client.url}/v1/actorjet/episodes/{self.episode_id}/{verb}", self.api_key,
              {"reward": self.reward, "task": self.task, "group": self.group}, done_if=ENDED)
        return False


class Client:
    def __init__(self, head: str, token: str | None = None):
        url = head if head.startswith("http") else f"http://{head}"
        self.url = url.rstrip("/").removesuffix("/v1")
        self.token = token or os.environ.get("ACTORJET_TOKEN")
        if not self.token:
            raise UserError("client mode needs the cluster token (token=... or ACTORJET_TOKEN)")

    def episode(self, task=None, group: str | None = None, group_size: int = 1) -> Episode:
        return Episode(self, task, group, group_size)
