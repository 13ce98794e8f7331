"""The gateway's routes for finished episodes: rewards from runners, and client mode.

A runner posts each finished group's rewards here before it tells the registry, so an
episode the registry counts as finished is on disk.  Client mode lets any program open an
episode (its own key), make calls with it, and end it with a reward or abort it; the reward
goes to every trainable model's store, since the episode may have called them all.
"""
from __future__ import annotations

import json
import uuid

import aiohttp
from aiohttp import web

from actorjet.checks import int_in
from actorjet import signing
from actorjet.runtime.endpoints import client_ssl
from actorjet.serving import openai_api as api
from actorjet.serving.openai_api import ApiError, EngineUnavailable
from actorjet.serving.results_api import check_results
from actorjet.rl.rewards import bad_reward


class EpisodeRoutes:
    """Handlers bound to one gateway (serving/gateway_app.py): its store, secret and writer thread."""

    def __init__(self, gw):
        self.gw = gw

    async def results(self, request):
        """Finished episodes of one group, each proven by its own key: their rewards complete
        the group in this model's store.  A runner posts here before it tells the registry, so
        an episode the registry counts as finished is on disk.  Closed episodes are refused
        (named in the answer); the call is idempotent.  A frozen model stores nothing."""
        group, clean = check_results(await api.read_json(request), self.gw.secret)
        if not self.gw.record:
            return web.json_response({"stored": 0, "refused": []})
        refused = await self.gw.write(self.gw.store.put_results, group, clean)
        return web.json_response({"stored": len(clean) - len(refused), "refused": refused})

    async def open_episode(self, request):
        self.gw._cluster(request)
        body = await api.read_json(request) if request.can_read_body else {}
        group, size = body.get("group"), body.get("group_size", 1)
        if group is not None and (not isinstance(group, str) or not 0 < len(group) <= 200):
            raise ApiError(400, "'group' must be a string of 1 to 200 characters (or absent)", "group")
        if not int_in(size, 1, 1024):
            raise ApiError(400, "'group_size' must be an integer from 1 to 1024", "group_size")
        if len(json.dumps(body.get("task"))) > 100_000:
            raise ApiError(400, "'task' is over 100 kB of JSON", "task")
        episode_id = f"c{uuid.uuid4().hex[:16]}"
        key = signing.mint_key(self.gw.secret, episode_id)
        await self.gw.write(self.gw.store.open_client, episode_id, f"c_{group or episode_id}", size)
        self.gw.outbox({"event": "open", "episode_id": episode_id, "task": body.get("task"),
                     "group": body.get("group"), "group_size": body.get("group_size", 1)})
        return web.json_response({"episode_id": episode_id, "api_key": key, "model": self.gw.model,
                                  "base_urls": self.gw.directory()})

    async def end_episode(self, request):
        """A client ends (reward) or aborts its episode.  The reward goes to this model's store
        and to every other trainable model's, since the episode may have called them too."""
        episode_id, verb = request.match_info["episode"], request.match_info["verb"]
        if verb not in ("end", "abort"):
            raise web.HTTPNotFound()
        if self.gw._episode(request) != episode_id:
            raise ApiError(403, "this key belongs to another episode", kind="permission_error")
        body = await api.read_json(request) if request.can_read_body else {}
        reward = body.get("reward")
        why = bad_reward(reward) if verb == "end" else ""
        if why:      # NaN, infinity, a string, a nested object: refused here, never a poisoned batch
            raise ApiError(400, f"'reward': {why.removeprefix('invalid reward: ')}; e.g. 1.0 or "
                           "{\"proposer\": 1.0}", "reward")
        if verb == "abort":           # nothing will train on it: refuse its key, free its calls now
            await self.gw.write(self.gw.store.close, [episode_id])
        else:
            known = await self.gw.write(self.gw.store.client_group, episode_id)
            if known is None:
                raise ApiError(409, f"episode {episode_id} was opened at another gateway: end it there",
                               code="wrong_gateway")
            group = {"group_id": known[0], "size": known[1], "task_name": "client", "behavior": "client",
                     "version": 0}
            episode = {"episode_id": episode_id, "member": episode_id, "reward": reward}
            if self.gw.record:
                await self.gw.write(self.gw.store.put_results, group, [episode])
            await self._tell_peers(group, dict(episode, api_key=request.headers["Authorization"][7:].strip()))
        self.gw.outbox({"event": verb, "episode_id": episode_id})     # the reward stays in the stores
        return web.json_response({"ok": True})

    async def _tell_peers(self, group: dict, episode: dict) -> None:
        for name, url in self.gw.peers().items():
            if name == self.gw.model:
                continue
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                    async with session.post(url.removesuffix("/v1") + "/v1/actorjet/results",
                                            json={"group": group, "episodes": [episode]},
                                            ssl=client_ssl() or True) as resp:
                        if resp.status != 200:
                            raise EngineUnavailable(f"the gateway of {name} answered {resp.status}")
            except aiohttp.ClientError as e:
                raise EngineUnavailable(f"the gateway of {name} cannot store this episode's reward ({e})") from None
