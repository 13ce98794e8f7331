"""How a gateway calls its model's engines: one engine's HTTP client, and the router that
spreads calls over a model's engine replicas.

A model may run several engine replicas (``engines = N`` in its job entry); each announces
itself in the registry's directory as ``engine`` (replica 0) or ``engine.K`` with its own
weights receiver (``weights`` / ``weights.K``).  The gateway routes each call:

  * **an episode sticks to one replica** while it lives, so the replica's prefix cache holds
    its conversation (the next turn prefills only its new tokens);
  * a new episode goes to the replica with the **fewest outstanding requests** (ties in turn);
  * a replica that **fails** (refused connection, dropped connection, a 5xx, a dead batcher)
    is marked out at once and the call is sent again to another replica: a call is recorded
    only once it is answered (serving/gateway_app.py), so sending it again loses and doubles
    nothing.  An out replica is tried again after ``retry_s`` (one call, which fails fast
    while it is still dead) or as soon as the directory names it at a new address (its
    supervisor restarted it).

The learner publishes every weight version to every replica (actors/learner.py), so which
replica answers does not change what is trained: each answer carries its weight version.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import aiohttp

from actorjet.serving.batching_engine import GenRequest, GenResult
from actorjet.serving.engine_wire import read_answer, wire_request
from actorjet.serving.openai_api import EngineUnavailable

RETRY_S = 1.0
STICKY = 100_000        # episodes remembered for stickiness (the oldest are forgotten first)


def replica_services(service: dict) -> dict[str, tuple[dict, dict | None]]:
    """A model's directory entry → {replica kind ("engine", "engine.1", …): (its engine entry,
    its weights receiver entry or None)}, in replica order."""
    kinds = [k for k in service if k == "engine" or (k.startswith("engine.") and k[7:].isdigit())]
    kinds.sort(key=lambda k: int(k[7:] or 0))
    return {k: (service[k], service.get("weights" + k[6:])) for k in kinds}


def replica_addresses(service: dict) -> dict[str, tuple]:
    """{replica kind: (its engine actor's address, its weights receiver URL or None)}, for the
    replicas that announced an address (what a learner delivers weight versions to)."""
    return {name: (engine["address"], receiver["url"] if receiver else None)
            for name, (engine, receiver) in replica_services(service).items() if engine.get("address") is not None}




class HttpEngineBackend:
    """Calls one engine's /generate; no engine → EngineUnavailable (a 503).

    Requests that arrive in one turn of the event loop travel in one HTTP call: under
    load that is tens of LLM calls per round trip, which is most of the gateway's and the
    engine's CPU otherwise."""

    def __init__(self, token: str | None = None):
        self.url: str | None = None
        self.token = token
        self.session: aiohttp.ClientSession | None = None
        self._pending: list[tuple[GenRequest, asyncio.Future]] = []

    async def __call__(self, req: GenRequest) -> list[GenResult]:
        if self.url is None:
            raise EngineUnavailable("no engine registered yet")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((req, future))
        if len(self._pending) == 1:
            loop.call_soon(lambda: loop.create_task(self._send()))
        return await future

    async def _send(self) -> None:
        batch, self._pending = self._pending, []
        try:
            answers = await self._post([wire_request(req) for req, _ in batch])
        except EngineUnavailable as e:
            answers = [e] * len(batch)
        except Exception as e:  # noqa: BLE001 - every waiting request must get an answer
            answers = [EngineUnavailable(f"{type(e).__name__}: {e}")] * len(batch)
        for (_, future), answer in zip(batch, answers):
            if future.done():
                continue
            outcome = answer if isinstance(answer, Exception) else read_answer(answer)
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _post(self, requests: list[dict]) -> list:
        if self.url is None:
            raise EngineUnavailable("no engine registered yet")
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            async with self.session.post(self.url + "/generate", json={"requests": requests}, headers=headers) as resp:
                if resp.status != 200:
                    raise EngineUnavailable(f"engine answered {resp.status}")
                return (await resp.json())["answers"]
        except (aiohttp.ClientConnectionError, aiohttp.ServerDisconnectedError) as e:
            raise EngineUnavailable(str(e)) from None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class ReplicaRouter:
    """The gateway's backend over a model's engine replicas (the rules in this module's
    docstring).  ``set_replicas`` comes from the directory (the actor's thread); calls come
    from the gateway's event loop."""

    def __init__(self, token: str | None = None, retry_s: float = RETRY_S):
        self.token, self.retry_s = token, retry_s
        self.urls: dict[str, str] = {}                     # replica → its engine URL
        self.clients: dict[str, HttpEngineBackend] = {}    # (made in the event loop, on first use)
        self.out_until: dict[str, float] = {}              # replica → when to try it again
        self.outstanding: dict[str, int] = {}
        self.served: dict[str, int] = {}                   # calls answered, per replica (status)
        self.failed: dict[str, int] = {}                   # calls sent again elsewhere, per replica
        self.sticky: OrderedDict[str, str] = OrderedDict()
        self.turn = 0

    def set_replicas(self, urls: dict[str, str]) -> None:
        """The replicas the directory names now; one at a new URL (restarted) is in again."""
        for name, url in urls.items():
            if self.urls.get(name) != url:
                self.out_until.pop(name, None)
        self.urls = dict(urls)

    def replica_stats(self) -> dict[str, dict]:
        now = time.monotonic()
        return {name: {"url": url, "out": self.out_until.get(name, 0) > now,
                       "outstanding": self.outstanding.get(name, 0), "served": self.served.get(name, 0),
                       "failed": self.failed.get(name, 0)} for name, url in self.urls.items()}

    def _pick(self, key: str, tried: set[str]) -> str | None:
        now = time.monotonic()
        up = [n for n in self.urls if n not in tried and self.out_until.get(n, 0) <= now]
        if not up:
            return None
        name = self.sticky.get(key) if key else None
        if name not in up:          # the least busy; ties in turn (else one replica takes every quiet call)
            least = min(self.outstanding.get(n, 0) for n in up)
            tied = [n for n in up if self.outstanding.get(n, 0) == least]
            name = tied[self.turn % len(tied)]
            self.turn += 1
        if key:
            self.sticky[key] = name
            self.sticky.move_to_end(key)
            if len(self.sticky) > STICKY:
                self.sticky.popitem(last=False)
        return name

    def _client(self, name: str) -> HttpEngineBackend:
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = HttpEngineBackend(self.token)
        client.url = self.urls.get(name)       # None (gone from the directory meanwhile): unavailable
        return client

    async def __call__(self, req: GenRequest) -> list[GenResult]:
        key = (req.cache_key or "").split("/")[0]       # the episode: its roles share a replica
        tried: set[str] = set()
        last: EngineUnavailable | None = None
        while (name := self._pick(key, tried)) is not None:
            tried.add(name)
            self.outstanding[name] = self.outstanding.get(name, 0) + 1
            try:
                results = await self._client(name)(req)
            except EngineUnavailable as e:
                last = e
                self.out_until[name] = time.monotonic() + self.retry_s
                self.failed[name] = self.failed.get(name, 0) + 1
                continue
            finally:
                self.outstanding[name] -= 1
            self.served[name] = self.served.get(name, 0) + 1
            return results
        if last is not None:
            raise EngineUnavailable(f"every engine replica failed ({', '.join(sorted(tried))}): {last}")
        raise EngineUnavailable("no engine registered yet" if not self.urls else "every engine replica is out")

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
