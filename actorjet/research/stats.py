"""Statistics a study decides and reports with.  Plain Python and a fixed seed: the same
registry gives the same report.

Why two intervals.  A study compares arms of 3 seeds or so.  The percentile bootstrap is what
people expect to read, but with n = 3 it is far too narrow (it uses the sample's spread as if
it were known and a normal quantile instead of a t one): in bench/research.py it called a
knob that changes nothing significant.  Decisions therefore use Welch's t interval, which is
exact for normal data at any n and does not assume equal spreads; the report shows the
bootstrap interval next to it, labelled as such.
"""
from __future__ import annotations

import functools
import math
import random
import statistics


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (df may be fractional, as
    Welch's is).  Bisection on the CDF: slow by numerical standards, a millisecond here."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def _t_cdf(x: float, df: float, steps: int = 2000) -> float:
    """P(T <= x) for x >= 0: 1/2 plus Simpson's rule on the density over [0, x]."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(u: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(u * u / df))

    h = x / steps
    total = density(0.0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return 0.5 + total * h / 3


def mean_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean (a single value has no interval)."""
    if not values:
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(1 - (1 - confidence) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def diff_ci(a: list[float], b: list[float], confidence: float = 0.95, rounds: int = 4000) -> dict:
    """mean(a) - mean(b): Welch's t interval (``low``, ``high``; what ``detectable`` — the
    interval excludes 0 — is decided on), the percentile bootstrap interval (``boot_low``,
    ``boot_high``; reported only) and Cohen's d."""
    if len(a) < 2 or len(b) < 2:
        return {"diff": math.nan, "low": math.nan, "high": math.nan, "boot_low": math.nan, "boot_high": math.nan,
                "d": math.nan, "df": math.nan, "detectable": False, "n": [len(a), len(b)]}
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se > 0:
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        half = t_quantile(1 - (1 - confidence) / 2, df) * se
    else:                       # every seed gave the same value in both arms
        df, half = math.inf, 0.0
    rng = random.Random(0)
    boots = sorted(statistics.fmean(rng.choices(a, k=len(a))) - statistics.fmean(rng.choices(b, k=len(b)))
                   for _ in range(rounds))
    pooled = math.sqrt((statistics.variance(a) + statistics.variance(b)) / 2)
    low, high = diff - half, diff + half
    return {"diff": diff, "low": low, "high": high,
            "boot_low": _pct(boots, (1 - confidence) / 2), "boot_high": _pct(boots, 1 - (1 - confidence) / 2),
            "d": diff / pooled if pooled > 0 else math.inf * (diff or 0), "df": df,
            "detectable": low > 0 or high < 0, "n": [len(a), len(b)]}


def _pct(sorted_values: list[float], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]
