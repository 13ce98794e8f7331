"""Statistics a study reports: bootstrap confidence intervals of a difference of means and an
effect size.  Plain Python and a fixed seed: the same registry gives the same report."""
from __future__ import annotations

import math
import random
import statistics


def mean_ci(values: list[float], confidence: float = 0.95, rounds: int = 4000) -> tuple[float, float, float]:
    """(mean, low, high) by the percentile bootstrap."""
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(rounds))
    return statistics.fmean(values), _pct(means, (1 - confidence) / 2), _pct(means, 1 - (1 - confidence) / 2)


def diff_ci(a: list[float], b: list[float], confidence: float = 0.95, rounds: int = 4000) -> dict:
    """mean(a) - mean(b) with its bootstrap CI and Cohen's d; ``detectable``: the CI excludes 0."""
    if len(a) < 2 or len(b) < 2:
        return {"diff": math.nan, "low": math.nan, "high": math.nan, "d": math.nan, "detectable": False,
                "n": [len(a), len(b)]}
    rng = random.Random(0)
    diffs = sorted(statistics.fmean(rng.choices(a, k=len(a))) - statistics.fmean(rng.choices(b, k=len(b)))
                   for _ in range(rounds))
    low, high = _pct(diffs, (1 - confidence) / 2), _pct(diffs, 1 - (1 - confidence) / 2)
    pooled = math.sqrt((statistics.variance(a) + statistics.variance(b)) / 2)
    diff = statistics.fmean(a) - statistics.fmean(b)
    return {"diff": diff, "low": low, "high": high, "d": diff / pooled if pooled > 0 else math.inf * (diff or 0),
            "detectable": low > 0 or high < 0, "n": [len(a), len(b)]}


def _pct(sorted_values: list[float], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]
