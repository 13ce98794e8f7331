"""A finished lease's rewards go to the episode store of every model, and only there; the
registry then hears which episodes are done and which failed, never a reward.

The store of each model sits with its gateway (store/episode_store.py); the runner already
reaches every gateway for its LLM calls, so it posts the lease's good results to each
gateway's ``/v1/actorjet/results``, each episode proven by its own key.  An episode whose
reward could not be stored (a gateway down, a closed episode) is reported to the registry
as failed, with that cause, and leased again: a group the registry counts as finished is on
disk in every store, and the stores alone say it is complete (store/completed.py).  One POST
per gateway per lease, whatever the episodes did.
"""
from __future__ import annotations

from actorjet.rl.rewards import failed
from actorjet.runtime import http_json

TIMEOUT_S = 30.0


def store_results(lease: dict, results: list[dict]) -> list[dict]:
    """Post the lease's finished episodes to every gateway; returns what the registry hears
    (``outcomes``): those not stored everywhere come back failed.  ``results`` are the
    runner's (episode_id, reward, error)."""
    good = [r for r in results if not r.get("error") and r.get("reward") is not None]
    if not good:
        return outcomes(results)
    body = rewards_body(lease, good)
    why: dict[str, str] = {}
    for model, url in sorted(lease["urls"].items()):
        try:
            answer = http_json.post(url.removesuffix("/v1") + "/v1/actorjet/results", body, timeout=TIMEOUT_S)
            for episode_id in answer.get("refused", []):
                why.setdefault(episode_id, f"store refused: the episode was closed at {model}'s gateway")
        except (http_json.HttpError, http_json.Unreachable) as e:
            detail = e.message if isinstance(e, http_json.HttpError) else e.reason
            for r in good:
                why.setdefault(r["episode_id"], f"store unreachable: {model}'s gateway: {detail}")
    return outcomes([failed(r["episode_id"], why[r["episode_id"]]) if r["episode_id"] in why else r for r in results])


def rewards_body(lease: dict, good: list[dict]) -> dict:
    """What a gateway's ``/v1/actorjet/results`` takes for a lease's episodes that ended with a
    reward (``good``: episode_id, reward): the group, and each episode proven by its key."""
    keys = {e["episode_id"]: e["api_key"] for e in lease["episodes"]}
    members = {e["episode_id"]: k for e, k in zip(lease["episodes"], lease.get("members", range(10 ** 9)))}
    group = {"group_id": lease["group_id"], "size": lease["group_size"], "task_name": lease["task_name"],
             "behavior": lease["behavior"], "version": lease["version"]}
    return {"group": group, "episodes": [
        {"episode_id": r["episode_id"], "api_key": keys[r["episode_id"]],
         "member": members.get(r["episode_id"], r["episode_id"]), "reward": r["reward"],
         **({"leased_at": lease["leased_at"]} if "leased_at" in lease else {})} for r in good]}


def outcomes(results: list[dict]) -> list[dict]:
    """Done or failed per episode, without the reward (GroupResult): a result with neither a
    reward nor an error is a failure too."""
    return [{"episode_id": r["episode_id"]} if not r.get("error") and r.get("reward") is not None else
            {"episode_id": r["episode_id"], "error": r.get("error") or "no reward"} for r in results]
