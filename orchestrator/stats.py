"""How sure an answer is: intervals over seeds, paired differences, verdicts and the seeds a verdict
would need. Pure functions of plain numbers; every sweep, study and report reads its uncertainty here.

A configuration trained with R seeds has R values of its objective. Its 95% interval is Student's t
over them; with one seed there is no seed spread to measure, and the interval falls back on the
validation's own standard error (a binomial-style measurement error that ignores seed noise: said
wherever it is shown). Two configurations trained on the same seeds are compared by their paired
differences, seed by seed (the same data order and validation problems on both sides).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95
POWER = 0.8
MAX_SEEDS = 10_000  # "more than this" is reported as this: the difference is too small to chase


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% interval; `source` says what the interval measures."""

    mean: float
    low: float
    high: float
    n: int
    source: str  # "seeds" (Student t over seeds) or "validation" (measurement error only, one seed)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def format(self, digits: int = 3) -> str:
        if math.isnan(self.low):
            return f"{self.mean:.{digits}f}"
        note = "" if self.source == "seeds" else " (validation error only)"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]{note}"


def t_quantile(n: int, level: float = LEVEL) -> float:
    """Student t's two-sided `level` quantile with n - 1 degrees of freedom."""
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def seed_interval(values: Sequence[float], se: float | None = None, level: float = LEVEL) -> Interval:
    """mean ± t_{n-1} · sd / √n over seeds; one seed: mean ± z · se (the validation's standard error,
    seed noise ignored), or no interval (NaN bounds) without it."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("seed_interval: no values")
    n, mean = len(values), sum(values) / len(values)
    if n == 1:
        half = float(stats.norm.ppf(0.5 + level / 2)) * se if se is not None else math.nan
        return Interval(mean, mean - half, mean + half, 1, "validation")
    sd = stdev(values)
    half = t_quantile(n, level) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, "seeds")


def stdev(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator)."""
    n, mean = len(values), sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan


def paired_difference(
    a: Sequence[float], b: Sequence[float], se: float | None = None, level: float = LEVEL
) -> Interval:
    """d_r = a_r - b_r over the seeds both ran, and its interval (seed_interval of the d_r). With one
    seed, `se` is the standard error of one difference (e.g. √(se_a² + se_b²))."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} and {len(b)} values; pair them seed by seed")
    return seed_interval([x - y for x, y in zip(a, b)], se, level)


def verdict(diff: Interval, mode: str = "max") -> str:
    """better / worse (the interval over seeds excludes 0, in the objective's direction), else
    inconclusive. One seed measures no seed spread: inconclusive, whatever its validation error says."""
    if diff.source != "seeds" or math.isnan(diff.low) or diff.low <= 0 <= diff.high:
        return "inconclusive"
    above = diff.low > 0
    return "better" if above == (mode == "max") else "worse"


def seeds_needed(diffs: Sequence[float], level: float = LEVEL, power: float = POWER) -> int | None:
    """Pairs for a paired t-test at `level` (two-sided) to find the measured mean difference with
    `power`: the least n with √n · |mean| / sd >= t_{1-α/2,n-1} + t_{power,n-1}. Post-hoc: the measured
    effect is itself uncertain (`seeds_range`). None when it cannot be estimated (fewer than two
    differences); MAX_SEEDS when the mean difference is zero or tiny."""
    if len(diffs) < 2:
        return None
    mean, sd = sum(diffs) / len(diffs), stdev(diffs)
    if sd == 0:
        return len(diffs) if mean != 0 else MAX_SEEDS
    return seeds_for_effect(mean / sd, 1 - level, power, MAX_SEEDS)


def seeds_range(diffs: Sequence[float], level: float = LEVEL, power: float = POWER) -> tuple[int, int] | None:
    """`seeds_needed` at the two ends of the standardized effect's 95% interval: (fewest, most);
    MAX_SEEDS (unbounded) when the interval reaches 0."""
    bounds = effect_interval(diffs)
    if bounds is None:
        return None
    low, high = bounds
    far = max(abs(low), abs(high))
    near = 0.0 if low <= 0 <= high else min(abs(low), abs(high))
    return seeds_for_effect(far, 1 - level, power, MAX_SEEDS), seeds_for_effect(near, 1 - level, power, MAX_SEEDS)


def seeds_text(n: int | None) -> str:
    """A table cell for `seeds_needed`: "-" (not estimable), the count, or ">= MAX_SEEDS"."""
    return "-" if n is None else f">= {MAX_SEEDS}" if n >= MAX_SEEDS else str(n)


def describe(
    diff: Interval,
    outcome: str,
    seeds: int | None,
    what: str = "the baseline",
    label: str = "best - baseline",
    span: tuple[int, int] | None = None,
) -> str:
    """One line: the paired difference, its verdict, and (when inconclusive) the pairs a paired t-test
    at α = 0.05, power 0.8 would need at the measured effect, with that estimate's own range."""
    line = f"{label} = {diff.format()}: "
    if outcome == "equivalent":
        return line + f"equivalent to {what}"
    if outcome != "inconclusive":
        return line + f"{outcome} than {what}"
    line += f"inconclusive at {diff.n} seed{'s' * (diff.n != 1)}"
    if diff.source != "seeds":
        return line + " (one seed measures no seed spread)"
    if seeds is not None:
        line += f"; {needed_text(seeds, span)}"
    return line


def needed_text(seeds: int, span: tuple[int, int] | None) -> str:
    """ "about N pairs (α 0.05 two-sided, power 0.8; A to B within the effect's 95% interval)"."""
    count = f"about {seeds}" if seeds < MAX_SEEDS else "more than any affordable number of"
    within = (
        ""
        if span is None
        else f"; {span[0]} to {'unbounded' if span[1] >= MAX_SEEDS else span[1]} within the effect's 95% interval"
    )
    return (
        f"{count} seed pairs would give a paired t-test (alpha 0.05 two-sided) power 0.8 at the measured effect{within}"
    )


def effect_interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The standardized effect δ = μ / σ of paired differences, its `level` interval by inverting the
    noncentral t (the observed t = √n · mean / sd has noncentrality √n · δ). None below 2 differences,
    without spread, or where scipy's noncentral t cannot reach the tail (|t| in the hundreds)."""
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return None
    t_obs, df, root = math.sqrt(n) * mean / sd, n - 1, math.sqrt(n)

    def cdf(d: float) -> float:  # P(T <= t_obs | δ = d); scipy's nct gives NaN far in a tail: 0 or 1 there
        p = float(stats.nct.cdf(t_obs, df, d * root))
        return p if not math.isnan(p) else float(d * root < t_obs)

    def solve(q: float) -> float:  # δ with P(T <= t_obs | δ) = q: cdf falls as δ grows; widen until it brackets
        centre, width = t_obs / root, 1.0
        while not (cdf(centre - width) > q > cdf(centre + width)):
            width *= 2
            if width > 1e3:  # scipy's nct loses the tail before it brackets: no interval to give
                return math.nan
        return optimize.brentq(lambda d: cdf(d) - q, centre - width, centre + width)

    bounds = solve(0.5 + level / 2), solve(0.5 - level / 2)
    return None if any(math.isnan(b) for b in bounds) else bounds


def seeds_for_effect(effect: float, alpha: float = 1 - LEVEL, power: float = POWER, cap: int = MAX_SEEDS) -> int:
    """Pairs for a two-sided paired t-test at α to detect the standardized effect with `power`:
    the least n with √n · |δ| >= t_{1-α/2, n-1} + t_{power, n-1}; `cap` when none below it."""
    ns, needed = _power_thresholds(alpha, power, cap)
    found = np.flatnonzero(np.sqrt(ns) * abs(effect) >= needed)
    return int(ns[found[0]]) if found.size else cap


@functools.lru_cache(maxsize=8)
def _power_thresholds(alpha: float, power: float, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(n = 2 .. cap - 1, t_{1-α/2, n-1} + t_{power, n-1}), computed once per (α, power, cap)."""
    ns = np.arange(2, cap)
    return ns, stats.t.ppf(1 - alpha / 2, ns - 1) + stats.t.ppf(power, ns - 1)
