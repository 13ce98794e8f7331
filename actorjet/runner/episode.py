"""One episode of a behavior, the same wherever it runs: a runner actor's thread pool, a
task's worker process (isolation = process) or an outbound node (runner/outbound.py).

Agent code may fail in any way; whatever it does stays inside its episode and is reported
as that episode's error, never as the runner's.
"""
from __future__ import annotations

import traceback

from actorjet import behaviors
from actorjet.rl.rewards import bad_reward, failed
from actorjet.runner.llm import LLM


def load_behavior(payload) -> tuple[object, str, str]:
    """(function, error, traceback): code that fails to verify or to unpickle never crashes
    the runner; it is reported and the runner keeps its old version."""
    try:
        return behaviors.load(payload), "", ""
    except behaviors.BehaviorRejected as e:
        return None, f"refused: {e}", ""
    except Exception as e:  # noqa: BLE001 - unpickling runs arbitrary code
        return None, f"could not load: {type(e).__name__}: {e}", traceback.format_exc(limit=-8)


def run_episode(fn, task: dict, urls: dict, episode: dict) -> dict:
    """One episode; any exception stays inside it and is reported as the episode's error."""
    try:
        reward = fn(dict(task), LLM(urls, episode["api_key"], episode["episode_id"]))
    except Exception as e:  # noqa: BLE001 - agent code may fail in any way
        return dict(failed(episode["episode_id"], f"{type(e).__name__}: {e}"),
                    traceback=traceback.format_exc(limit=-8))
    why = bad_reward(reward)       # NaN, a string, a nested dict: a failed episode, never a poisoned batch
    if why:
        return failed(episode["episode_id"], f"{why} (returned by the behavior)")
    return {"episode_id": episode["episode_id"], "reward": reward}
