"""The body of ``POST /v1/actorjet/results`` (a gateway's), checked.

Runners post a finished lease's episodes there (runner/results.py), and a gateway forwards
a client-mode end to the other trainable gateways the same way.  Each episode is proven by
its own key, so a reward is only ever accepted for the episode it was minted for; anything
malformed is a 4xx naming the field, never a poisoned store.
"""
from __future__ import annotations

import math

from actorjet import signing
from actorjet.checks import int_in, is_int
from actorjet.rl.rewards import bad_reward
from actorjet.serving.openai_api import ApiError

MAX_TIME = 1e11        # seconds since 1970: year 5138; a leased_at past it is not a time


def check_results(body: dict, secret: str) -> tuple[dict, list[dict]]:
    """(group, episodes) as the episode store takes them, or ApiError."""
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
