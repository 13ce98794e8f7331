"""What a reward may be, and what a failed episode's result looks like.

A reward is checked wherever one enters: the runner (a behavior's return value) and the
gateway (a runner's results, a client's /end), which writes it to the episode store.  The
registry never sees one (store/completed.py).

A reward is a finite number, or an object naming models or roles with finite numbers
(``{"proposer": 1.0, "verifier": 0.0}``); in place of any of those numbers, per-turn rewards
``{"turns": [r0, r1, ...], "final": r}``: ``turns[i]`` is earned by the episode's i-th call
(of the model or role it is for), ``final`` at its end.  Group estimators fold them into one
number (``total``); PPO credits them turn by turn (rl/token_credit.py).  Anything else — NaN, infinity, a string, a
nested object, a boolean — would reach the advantage computation and poison a whole
batch, so it is refused at the edge with the reason below.
"""
from __future__ import annotations


from actorjet.checks import is_number

MAX_KEYS = 64


def _finite(x) -> bool:
    return is_number(x)


MAX_TURNS = 10_000


def is_per_turn(reward) -> bool:
    return isinstance(reward, dict) and "turns" in reward and set(reward) <= {"turns", "final"}


def reward_for(reward, model: str, role: str):
    """One model's (or role's) part of an episode's reward: a behavior returns one reward for
    everyone, or {role_or_model: reward}, each a number or per-turn rewards.  None: nothing
    for this model or role."""
    if isinstance(reward, (int, float)) or is_per_turn(reward):
        return reward
    if isinstance(reward, dict):
        for key in (role, model, "default"):
            if key in reward:
                return reward[key]
    return None


def _bad_per_turn(reward, where: str) -> str:
    turns, final = reward["turns"], reward.get("final", 0.0)
    if not isinstance(turns, list) or len(turns) > MAX_TURNS:
        return f"invalid reward: {where}'turns' must be a list of at most {MAX_TURNS} numbers"
    for i, value in enumerate(turns):
        if not _finite(value):
            return f"invalid reward: {where}turns[{i}] must be a finite number, got {_show(value)}"
    if not _finite(final):
        return f"invalid reward: {where}'final' must be a finite number, got {_show(final)}"
    return ""


def total(reward) -> float:
    """A number, or per-turn rewards folded into one (their sum plus the final one)."""
    if is_per_turn(reward):
        return float(sum(reward["turns"]) + reward.get("final", 0.0))
    return float(reward)


def bad_reward(reward) -> str:
    """'' for a valid reward, else why not (one line, starting with 'invalid reward')."""
    if _finite(reward):
        return ""
    if is_per_turn(reward):
        return _bad_per_turn(reward, "")
    if isinstance(reward, dict):
        if not reward or len(reward) > MAX_KEYS:
            return f"invalid reward: an object of 1 to {MAX_KEYS} model or role names"
        for key, value in reward.items():
            if not isinstance(key, str) or not key or len(key) > 200:
                return "invalid reward: object keys must be model or role names"
            if is_per_turn(value):
                if why := _bad_per_turn(value, f"{key!r}: "):
                    return why
            elif not _finite(value):
                return f"invalid reward: {key!r} must be a finite number or per-turn rewards, got {_show(value)}"
        return ""
    return f"invalid reward: must be a finite number or an object of them, got {_show(reward)}"


def failed(episode_id: str, error: str) -> dict:
    """The one shape of a failed episode's result: no reward, and why (one line)."""
    return {"episode_id": episode_id, "reward": None, "error": error}


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
