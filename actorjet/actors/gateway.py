"""The gateway actor: runs one model's OpenAI-compatible gateway and relays its events.

It opens the model's episode store on this node (store/episode_store.py): the gateway
writes every call and every finished episode's reward there; the learner reads it.

The HTTP server lives in a thread; control-plane traffic (client-mode episode events to
the registry, the engine's address from the registry's directory) goes through this
actor's thespian mailbox.  Events are handed from the HTTP thread through a queue that a
short wakeup loop drains.
"""
from __future__ import annotations

import asyncio
import base64
import time
from array import array
from datetime import timedelta

import aiohttp
from thespian.actors import WakeupMessage

from actorjet.config import engine_of
from actorjet.models.prepare import model_config_here
from actorjet.runtime import endpoints
from actorjet.store import completed, episode_store
from actorjet.serving.batching_engine import GenRequest, GenResult
from actorjet.serving.gateway_app import GatewayApp
from actorjet.serving.openai_api import EngineUnavailable
from actorjet.serving.openai_api import ApiError
from actorjet.serving.serve import AppServer
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.inbox import Inbox

FLUSH_S = 0.05
PROGRESS_S = 1.0


def wire_request(req: GenRequest) -> dict:
    """A request as JSON, its prompt as base64 of int32 (a 32k-token prompt as a JSON list of
    numbers took ~2 ms to write and more to read, on every call of a long episode)."""
    body = dict(req.__dict__)
    ids = body["prompt_ids"]
    body["prompt_ids"] = base64.b64encode((ids if isinstance(ids, array) else array("i", ids)).tobytes()).decode()
    return body


class HttpEngineBackend:
    """Calls the engine actor's /generate; no engine → EngineUnavailable (a 503).

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
            if isinstance(answer, Exception):
                future.set_exception(answer)
            elif "error" in answer and answer.get("request_error"):
                future.set_exception(ApiError(400, f"the engine could not serve this request: {answer['error']}",
                                              code="invalid_request"))
            elif "error" in answer:
                future.set_exception(EngineUnavailable(f"the engine failed: {answer['error']}"))
            else:
                future.set_result([GenResult(**r) for r in answer["results"]])

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


class Gateway(ManagedActor):
    def on_init(self) -> None:
        from transformers import AutoConfig, AutoTokenizer

        job = self.context["job"]
        self.model = self.args["model"]
        cfg = model_config_here(job, self.model)
        tokenizer = AutoTokenizer.from_pretrained(cfg["path"])
        self.backend = HttpEngineBackend(self.context["token"])
        self.events = Inbox()                      # client-mode episode events from the HTTP thread
        self.base_urls: dict[str, str] = {}
        self.trainable_urls: dict[str, str] = {}
        trainable = {m["name"] for m in job["models"] if m.get("trainable", True)}
        self.trainable = trainable
        self.store = episode_store.EpisodeStore(
            episode_store.path_for(endpoints.local_run_dir(self.context), self.model)) if cfg["trainable"] else None
        max_len = int(getattr(AutoConfig.from_pretrained(cfg["path"]), "max_position_embeddings", 2048))
        self.app = GatewayApp(self.model, tokenizer, self.backend, self.context["token"], max_len,
                              default_max_tokens=cfg["default_max_tokens"], outbox=self.events.put,
                              directory=lambda: dict(self.base_urls), record=bool(cfg["trainable"]),
                              store=self.store, peers=lambda: dict(self.trainable_urls),
                              adapter=self.model if cfg.get("base") else "", tool_parser=cfg.get("tool_parser", ""))
        self.engine_of = engine_of(job, self.model)
        # bound to this node's address and advertised as reachable from other hosts; a
        # restarted gateway comes back on the same port (runtime/endpoints.py)
        self.server = AppServer(self.app.app(), name=f"gateway.{self.model}", port=cfg["gateway_port"], tls=True)
        self.announce(self.model, {"gateway": self.server.url + "/v1"}, subscribe=True)
        self.reported = 0.0
        self.wakeupAfter(timedelta(seconds=FLUSH_S))

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        engine = msg.services.get(self.engine_of, {}).get("engine")
        self.backend.url = engine["url"] if engine else None
        self.base_urls = {name: s["gateway"]["url"] for name, s in msg.services.items() if "gateway" in s}
        self.trainable_urls = {k: v for k, v in self.base_urls.items() if k in self.trainable}

    def receiveMsg_CloseEpisodes(self, msg: proto.CloseEpisodes, sender):
        """Episodes that will never be trained: refuse their keys, free their calls."""
        self.app.store.close([e for e in msg.episode_ids if isinstance(e, str)], str(getattr(msg, "cause", ""))[:300])

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        for event in self.events.drain():
            self.send(self.registry, proto.ClientEvent(dict(event, model=self.model)))
        if time.monotonic() - self.reported >= PROGRESS_S:
            # Liveness for the watchdog: the server loop's turns.  Work is always "waiting" for
            # a gateway (its loop must keep turning); a request stuck in the engine is the
            # engine's stall, not the gateway's, so completions would be the wrong measure.
            self.reported = time.monotonic()
            self.send(self.registry, proto.Progress(self.model, "gateway", self.server.beats, 1))
            active, self.app.active = self.app.active, set()      # (a call in the swap is seen next time)
            active |= set(list(self.app.calling))                   # waiting on the engine is not idle
            if active:
                self.send(self.registry, proto.EpisodeActivity(self.model, sorted(active)))
            if self.store is not None and self.registry is not None:   # what the store judged (store/completed.py)
                self.send(self.registry, proto.StoreNews(self.model, completed.news(self.store),
                                                         completed.untrained(self.store)))
        self.wakeupAfter(timedelta(seconds=FLUSH_S))

    def receiveMsg_GroupsLogged(self, msg: proto.GroupsLogged, sender):
        if self.store is not None:
            completed.told(self.store, [g for g in msg.group_ids if isinstance(g, str)])

    def receiveMsg_Stall(self, msg: proto.Stall, sender):
        self.server.block(msg.seconds)

    def on_stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop()
        if getattr(self, "store", None):
            self.store.close_db()
