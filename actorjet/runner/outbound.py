"""An outbound-only node: runs episodes for a swarm without accepting any connection.

`actorjet join --outbound http://HEAD:DOOR_PORT --token T` runs this loop instead of a
thespian member.  Top to bottom, every POLL_S:

1. report every lease whose episodes all finished (or whose time ran out: the hung ones are
   reported as timeouts and their threads abandoned) to the head's door;
2. once a second while it holds leases, ask the door which of them the registry expired (no
   LLM call for the idle limit, or past the total limit) and give up on those;
3. with free room and no back-off pending, ask the door for leases; install any behavior
   version that came with them (signed payloads, verified with this node's token before
   they are unpickled); start each lease's episodes in the thread pool.

Episodes are the same `run_episode` the thespian runners use, and their agents call the
gateways' URLs directly (connections out).  What a thespian node has and this one does
not: pushed upgrades and canaries (new versions arrive with the next lease), process
isolation per task, and a place in `status`'s runner table (the door lists it).  A node
that vanishes lets its leases expire; the registry re-queues them.
"""
from __future__ import annotations

import base64
import os
import time
import uuid
from typing import Callable

from actorjet.errors import UserError
from actorjet.runtime import http_json
from actorjet.signing import SECRET_ENV
from actorjet.runner.core import RunnerCore, Threads, groups_to_take
from actorjet.runner.results import store_results

POLL_S = 0.05
ABANDONED_POLL_S = 1.0


class DoorError(Exception):
    """The door could not be reached or refused a call that retrying may fix."""


class OutboundNode:
    def __init__(self, door: str, token: str, name: str, slots: int = 1, concurrency: int = 16,
                 say: Callable[[str], None] = print):
        url = door if door.startswith("http") else f"http://{door}"
        self.url, self.token, self.name = url.rstrip("/"), token, name
        if slots < 1 or concurrency < 1:
            raise UserError("--slots and --concurrency must be >= 1")
        self.capacity = slots * concurrency
        self.runner_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.core = RunnerCore(Threads(self.capacity))
        self.unsent: dict[str, tuple[dict, list[dict]]] = {}   # lease id → (lease, results) the door lacks
        self.retry_at = 0.0
        self.abandoned_asked = 0.0
        self.group_size = 1
        self.episodes_done = 0
        self.reachable: bool | None = None
        self.say = say
        os.environ[SECRET_ENV] = token          # behaviors are verified with it before unpickling

    # -- HTTP to the door -----------------------------------------------------------------
    def _post(self, path: str, body: dict) -> dict:
        try:
            answer = http_json.post(self.url + path, body, self.token)
        except http_json.HttpError as e:
            if e.status in (401, 403):
                raise UserError(f"the head's door refused this node: {e.message}") from None
            raise DoorError(f"{e.status} {e.message}") from None
        except http_json.Unreachable as e:
            self._reachable(False, e.reason)
            raise DoorError(str(e)) from None
        self._reachable(True)
        return answer

    def _reachable(self, now: bool, why: str = "") -> None:
        if now != self.reachable:
            if now and self.reachable is False:
                self.say(f"head reachable again at {self.url}")
            elif not now:
                self.say(f"cannot reach the head's door at {self.url} ({why}); retrying")
            self.reachable = now

    def check(self) -> None:
        """Fail fast with one line when the door is not there or the token is wrong."""
        say, self.say = self.say, lambda text: None      # one line on failure, no "retrying"
        try:
            self._post("/v1/actorjet/hello", {"runner_id": self.runner_id})
        except DoorError as e:
            raise UserError(f"cannot use the door at {self.url}: {e} (is it the URL `actorjet start` "
                            "printed for outbound nodes?)") from None
        finally:
            self.say = say

    # -- the loop ---------------------------------------------------------------------------
    def run(self, stopped: Callable[[], bool]) -> None:
        while not stopped():
            try:
                self.step()
            except DoorError:
                self.retry_at = time.monotonic() + 1.0
            time.sleep(POLL_S)

    def step(self) -> None:
        self._give_up_expired()
        self._report_finished()
        busy = self.core.busy() + len(self.core.still_hung())
        free_groups = groups_to_take(self.capacity, busy, self.group_size)
        if free_groups > 0 and time.monotonic() >= self.retry_at:
            self._lease(free_groups)

    def _give_up_expired(self) -> None:
        if not self.core.lease_ids() or time.monotonic() - self.abandoned_asked < ABANDONED_POLL_S:
            return
        self.abandoned_asked = time.monotonic()
        answer = self._post("/v1/actorjet/abandoned", {"runner_id": self.runner_id, "lease_ids": self.core.lease_ids()})
        for lease_id, cause in answer.get("abandoned", {}).items():
            self.core.abandon(lease_id, str(cause))

    def _report_finished(self) -> None:
        for lease, results in self.core.finished():
            self.unsent[lease["lease_id"]] = (lease, results)
        for lease_id, (lease, results) in list(self.unsent.items()):
            results = store_results(lease, results)      # in every model's store first (idempotent)
            self._post("/v1/actorjet/results", {"runner_id": self.runner_id, "lease_id": lease_id,
                                                "results": results})
            del self.unsent[lease_id]         # only once the head has it: a lost post is retried
            self.episodes_done += len(results)

    def _lease(self, max_groups: int) -> None:
        answer = self._post("/v1/actorjet/leases", {"runner_id": self.runner_id, "max_groups": max_groups,
                                                    "behaviors": dict(self.core.current)})
        for payload in answer.get("behaviors", {}).values():
            payload = dict(payload, blob=base64.b64decode(payload["blob"]))
            error, _ = self.core.install(payload)
            if error:
                self.say(f"behavior {payload.get('name')} v{payload.get('version')}: {error}")
        if not answer.get("leases"):
            self.retry_at = time.monotonic() + float(answer.get("retry_s") or 0.2)
            return
        for lease in answer["leases"]:
            self.group_size = max(1, len(lease["episodes"]))
            refused = self.core.start(lease)
            if refused is not None:
                self._post("/v1/actorjet/results", {"runner_id": self.runner_id, "lease_id": lease["lease_id"],
                                                    "results": refused})

    def close(self) -> None:
        """Stop taking work; episodes in flight are abandoned (their leases expire and are re-queued)."""
        self.core.close()
