"""The gateway's routes for finished episodes (rewards from runners, client mode) and the check
of the results they are posted.

A runner posts each finished group's rewards here before it tells the registry, so an
episode the registry counts as finished is on disk.  Client mode lets any program open an
episode (its own key), make calls with it, and end it with a reward or abort it; the reward
goes to every trainable model's store, since the episode may have called them all.
"""
from __future__ import annotations

import json
import math
import uuid

import aiohttp
from aiohttp import web

from actorjet.checks import int_in, is_int
from actorjet import signing
from actorjet.runtime.endpoints import client_ssl
from actorjet.serving import openai_api as api
from actorjet.serving.openai_api import ApiError, EngineUnavailable
from actorjet.rl.rewards import bad_reward

MAX_TIME = 1e11        # seconds since 1970: year 5138; a leased_at past it is not a time


def check_results(body: dict, secret: str) -> tuple[dict, list[dict]]:
    """The body of ``POST /v1/actorjet/results``, checked: (group, episodes) as the episode
    store takes them, or ApiError.  Runners post a finished lease's episodes there
    (runner/results.py), and a gateway forwards a client-mode end to the other trainable
    gateways the same way.  Each episode is proven by its own key, so a reward is only ever
    accepted for the episode it was minted for; anything malformed is a 4xx naming the
    field, never a poisoned store."""
    group, episodes = body.get("group"), body.get("episodes")
    if not isinstance(group, dict) or not isinstance(group.get("group_id"), str) \
            or not int_in(group.get("size"), 1, 4096):
        raise ApiError(400, "'group' must be an object with a string group_id and a size from 1 to 4096",
                       "group")
    for key in ("task_name", "behavior"):
        if not isinstance(group.get(key, ""), str):
            raise ApiError(400, f"'group.{key}' must be a string", "group")
    if not is_int(group.get("version", 0)):
        raise ApiError(400, "'group.version' must be an integer", "group")
    if not isinstance(episodes, list) or not episodes or len(episodes) > 4096:
        raise ApiError(400, "'episodes' must be a list of 1 to 4096 finished episodes", "episodes")
    clean = []
    for i, e in enumerate(episodes):
        if not isinstance(e, dict) or not isinstance(e.get("episode_id"), str):
            raise ApiError(400, f"episodes[{i}] must be an object with an episode_id", "episodes")
        if signing.verify_key(secret, str(e.get("api_key", ""))) != e["episode_id"]:
            raise ApiError(403, f"episodes[{i}]: the api_key is not this episode's key", kind="permission_error")
        client = group["group_id"].startswith("c_") and e["episode_id"].startswith("c")
        if not (e["episode_id"].startswith(group["group_id"] + ".") or client):
            raise ApiError(400, f"episodes[{i}]: episode {e['episode_id']} is not of group {group['group_id']}",
                           "episodes")
        why = bad_reward(e.get("reward"))
        if why:
            raise ApiError(400, f"episodes[{i}].reward: {why.removeprefix('invalid reward: ')}", "episodes")
        if not isinstance(e.get("member"), (str, int)) or isinstance(e.get("member"), bool):
            raise ApiError(400, f"episodes[{i}].member must be a string or an integer", "episodes")
        leased_at = e.get("leased_at")
        if leased_at is not None and (not isinstance(leased_at, (int, float)) or isinstance(leased_at, bool)
                                      or not math.isfinite(leased_at) or not 0 <= leased_at < MAX_TIME):
            raise ApiError(400, f"episodes[{i}].leased_at must be a Unix time in seconds (or absent)", "episodes")
        clean.append({"episode_id": e["episode_id"], "member": e["member"], "reward": e["reward"],
                      **({"leased_at": float(leased_at)} if leased_at is not None else {})})
    group = {"group_id": group["group_id"], "size": group["size"], "task_name": group.get("task_name"),
             "behavior": group.get("behavior"), "version": group.get("version")}
    return group, clean


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
