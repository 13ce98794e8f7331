"""The gateway actor: runs one model's OpenAI-compatible gateway and relays its events.

It opens the model's episode store on this node (store/episode_store.py): the gateway
writes every call and every finished episode's reward there; the learner reads it.

Calls go to the model's engine replicas through serving/engine_client.py (an episode sticks
to one replica; a failed replica is marked out and its calls sent again elsewhere).

The HTTP server lives in a thread; control-plane traffic (client-mode episode events to
the registry, the engine's address from the registry's directory) goes through this
actor's thespian mailbox.  Events are handed from the HTTP thread through a queue that a
short wakeup loop drains.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from thespian.actors import WakeupMessage

from actorjet.config import engine_of
from actorjet.models.prepare import model_config_here, preload_libraries
from actorjet import disk
from actorjet.runtime.heap import collect_young_less_often
from actorjet.runtime import endpoints
from actorjet.store import completed, episode_store
from actorjet.serving.engine_client import ReplicaRouter, replica_services
from actorjet.serving.gateway_app import GatewayApp
from actorjet.serving.serve import AppServer
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.inbox import Inbox

preload = preload_libraries      # runtime/kinds.py: what a head imports once, before forking this actor

FLUSH_S = 0.05           # how often client-mode events go to the registry while calls come
QUIET_AFTER_S = 10.0     # no call and no event for this long: the gateway is idle ...
QUIET_FLUSH_S = 0.25     # ... and wakes this often (an idle head's gateway used 3% of a core)
PROGRESS_S = 1.0
NO_ENGINE_S = 10.0       # without an engine this long: ask the registry for the directory again
log = logging.getLogger(__name__)


class Gateway(ManagedActor):
    def on_init(self) -> None:
        from transformers import AutoConfig, AutoTokenizer

        collect_young_less_often()        # 5% of its CPU went to young collections (runtime/heap.py)
        job = self.context["job"]
        self.model = self.args["model"]
        cfg = model_config_here(job, self.model)
        tokenizer = AutoTokenizer.from_pretrained(cfg["path"])
        self.backend = ReplicaRouter(self.context["token"])     # the model's engine replicas
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
        self.started, self.asked_again = time.monotonic(), False
        self.disk_reported = ""
        self.closes_waiting: list[tuple[list, str]] = []
        self.requests_seen, self.busy_at = 0, time.monotonic()
        self.wakeupAfter(timedelta(seconds=FLUSH_S))

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        self.backend.set_replicas({name: engine["url"] for name, (engine, _) in
                                   replica_services(msg.services.get(self.engine_of, {})).items()})
        self.base_urls = {name: s["gateway"]["url"] for name, s in msg.services.items() if "gateway" in s}
        self.trainable_urls = {k: v for k, v in self.base_urls.items() if k in self.trainable}

    def receiveMsg_CloseEpisodes(self, msg: proto.CloseEpisodes, sender):
        """Episodes that will never be trained: refuse their keys, free their calls."""
        ids, cause = [e for e in msg.episode_ids if isinstance(e, str)], str(getattr(msg, "cause", ""))[:300]
        if not self._store(self.app.store.close, ids, cause):
            self.closes_waiting.append((ids, cause))        # the disk is full: closed when it has room

    def _store(self, write, *args) -> bool:
        """A store write from this actor; False on a full disk, which is reported
        (actorjet/disk.py), never a crash (a restarted gateway would meet the same disk)."""
        try:
            write(*args)
            return True
        except Exception as e:
            if not disk.is_full(e):
                raise
            self.app.disk_full = disk.describe(e, self.store.path)
            return False

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        events = self.events.drain()
        for event in events:
            self.send(self.registry, proto.ClientEvent(dict(event, model=self.model)))
        if events or self.app.requests != self.requests_seen:
            self.requests_seen, self.busy_at = self.app.requests, time.monotonic()
        if time.monotonic() - self.reported >= PROGRESS_S:
            # Liveness for the watchdog: the server loop's turns.  Work is always "waiting" for
            # a gateway (its loop must keep turning); a request stuck in the engine is the
            # engine's stall, not the gateway's, so completions would be the wrong measure.
            self.reported = time.monotonic()
            self.send(self.registry, proto.Progress(self.model, "gateway", self.server.beats, 1))
            self.send(self.registry, proto.EngineReplicas(self.model, self.backend.replica_stats()))
            if not self.backend.urls and time.monotonic() - self.started > NO_ENGINE_S:
                # The directory comes when a service changes; one lost on the way would leave
                # this gateway without its engine for good (a 503 to every call): ask again.
                if not self.asked_again:
                    log.warning("gateway %s: no engine of %s known after %g s; asking the registry again",
                                self.model, self.engine_of, NO_ENGINE_S)
                self.asked_again = True
                self.send(self.registry, m.Subscribe("directory"))
            active, self.app.active = self.app.active, set()      # (a call in the swap is seen next time)
            active |= set(list(self.app.calling))                   # waiting on the engine is not idle
            if active:
                self.send(self.registry, proto.EpisodeActivity(self.model, sorted(active)))
            if self.store is not None and self.registry is not None:   # what the store judged (store/completed.py)
                self.send(self.registry, proto.StoreNews(self.model, completed.news(self.store),
                                                         *completed.standing(self.store)))
            if self.app.disk_full and self.store is not None and disk.has_room(self.store.path.parent):   # (no call may come to try)
                self.app.disk_full = ""
            while self.closes_waiting and not self.app.disk_full:
                if not self._store(self.app.store.close, *self.closes_waiting[0]):
                    break
                self.closes_waiting.pop(0)
            if self.app.disk_full != self.disk_reported and self.registry is not None:
                self.disk_reported = self.app.disk_full
                self.send(self.registry, proto.DiskFull(f"gateway.{self.model}", self.disk_reported))
        quiet = time.monotonic() - self.busy_at > QUIET_AFTER_S    # the first event after it waits ≤ 0.25 s
        self.wakeupAfter(timedelta(seconds=QUIET_FLUSH_S if quiet else FLUSH_S))

    def receiveMsg_GroupsLogged(self, msg: proto.GroupsLogged, sender):
        if self.store is not None:
            self._store(completed.told, self.store, [g for g in msg.group_ids if isinstance(g, str)])

    def receiveMsg_Stall(self, msg: proto.Stall, sender):
        self.server.block(msg.seconds)

    def on_stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop(self.stop_grace_s)
        if getattr(self, "store", None):
            self.store.close_db()
