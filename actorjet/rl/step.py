"""The learner's step as plain code: which sampled tokens are fresh enough to train on, and
the metrics line a step leaves.  The learner actor only moves messages around these
(actors/learner.py: pull → ``keep_fresh`` → grpo_step → publish → ``step_record``), so a reader
and a test can follow one step without an actor system.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

# the batch statistics (rl/batching.py) that a step's metrics line carries as they are
BATCH_STATS = ("calls", "merge", "sequences_before", "sequences_after", "tokens_before", "tokens_after",
               "token_ratio", "drift_repairs", "tools_unified", "text_aligned", "by_behavior", "by_task")


@dataclass
class Fresh:
    """The samples left after dropping tokens sampled too many versions ago."""
    samples: list[dict]
    dropped: int                                        # sampled tokens dropped as too old
    staleness: list[int] = field(default_factory=list)  # versions behind, per kept token

    @property
    def staleness_mean(self) -> float:
        return sum(self.staleness) / max(1, len(self.staleness))


def keep_fresh(samples: list[dict], version: int, max_staleness: int) -> Fresh:
    """Keep the terms sampled at ``version - max_staleness`` or later; a sample whose terms are
    all too old is dropped whole (its tokens would only be context).  Each kept sample is
    stamped ``trained_at = version``: the step's engine/learner mismatch is measured on the
    tokens sampled at the very weights the learner holds (rl/grpo.py)."""
    floor = version - max_staleness
    kept, dropped = [], 0
    for s in samples:
        fresh = [t for t in s["terms"] if t.version >= floor]
        dropped += len(s["terms"]) - len(fresh)
        if fresh:
            kept.append(dict(s, terms=fresh, trained_at=version))
    return Fresh(kept, dropped, [version - t.version for s in kept for t in s["terms"]])


@dataclass
class StepTimes:
    """Marks of one step (time.perf_counter), for its metrics line; ``wall`` is time.time()
    at ``start``, so the step timeline can place them among the other processes' marks."""
    start: float
    trained: float = 0.0       # the optimizer step began
    published: float = 0.0     # the optimizer step ended, publishing began
    done: float = 0.0          # the weights were published and delivered
    wall: float = field(default_factory=time.time)

    def at(self, mark: float) -> float:
        return self.wall + (mark - self.start)


def step_record(model: str, step: int, version: int, batch: dict, fresh: Fresh, info: dict,
                times: StepTimes, publish_bytes: int, push_s: float | None, other_ranks: list | None = None) -> dict:
    """The ``kind = "train"`` line of metrics.jsonl for one step (docs/metrics.md).  ``other_ranks``:
    with learner ranks, the step times ranks 1… reported; the line then has every rank's."""
    stats = batch["stats"]
    record = {"kind": "train", "model": model, "step": step, "weight_version": version,
              "reward_mean": stats.get("reward_mean"), "groups": len(batch["group_ids"]),
              "episodes": stats.get("episodes"), "zero_variance_groups": stats.get("zero_variance_groups"),
              "stale_tokens_dropped": fresh.dropped, "staleness_mean": fresh.staleness_mean,
              "staleness_max": max(fresh.staleness, default=0), "step_time_s": times.done - times.start,
              "train_s": times.published - times.trained, "publish_s": times.done - times.published,
              "publish_bytes": publish_bytes, "push_s": push_s,
              "batch_wait_s": time.time() - stats.get("created", time.time()),
              **{k: v for k, v in info.items() if k != "skipped"}}
    record.update({k: stats[k] for k in BATCH_STATS if k in stats})
    if other_ranks is not None and not info.get("skipped"):
        record["rank_step_s"] = [round(times.published - times.trained, 4), *other_ranks]
    return record


def timeline_record(model: str, step: int, version: int, batch: dict, times: StepTimes) -> dict:
    """The ``kind = "timeline"`` line of one step (docs/monitoring.md, monitor/timeline.py):
    each trained episode's stages as the store saw them (leased … taken), then when this step
    trained them, and the learner's own phases.  "Served" is the engine's line for this version."""
    rows = list(batch.get("timeline", ()))
    t0 = round(min((t for row in rows for t in row[1:] if t is not None), default=times.wall), 3)
    # Stages as whole milliseconds after t0: a step's line is ~12 KB for 256 episodes, not the
    # ~30 KB of Unix times in full (one line per step, kept for good in metrics.jsonl).
    return {"kind": "timeline", "model": model, "step": step, "weight_version": version,
            "stages": ["leased", "first_call", "last_answer", "stored", "complete", "taken"],
            "t0": t0,
            "episodes": [[row[0], *(None if t is None else round((t - t0) * 1000) for t in row[1:])]
                         for row in rows],
            "batch_ready": round(batch["stats"].get("created", times.wall), 4),
            "train_start": round(times.at(times.trained), 4), "trained": round(times.at(times.published), 4),
            "published": round(times.at(times.done), 4)}
