"""The sweep's decisions, each with an error rate it controls: which configurations the search stops
early, when a confirmation has seen enough seeds, and which of a study's verdicts survive multiplicity.
Pure functions of plain numbers; the sweep, the study and `python -m bench decisions` call the same ones.

- Pruning (`prune`): at a rung, a configuration is stopped only when its upper bound lies below the
  best lower bound among the configurations that reached the rung, both bounds from the seed SD pooled
  over them (`scheduler.level`, default 95%). No seed spread measured (one seed each): no pruning.
- Confirmation (`confirm_step`): the winner and the baseline on fresh seeds, paired seed by seed, looked
  at after `seeds`, then every `add` more pairs, up to `max_seeds`. Look k tests at its share α_k of
  α = 0.05, spent by an error-spending function α(t) of the information fraction t = n_k / n_K
  (Lan & DeMets 1983): O'Brien-Fleming-type α(t) = 2 - 2Φ(z_{1-α/2} / √t) (the default) or
  Pocock-type α(t) = α ln(1 + (e - 1) t). Each look's test is a paired t-test at α_k (better or worse)
  and TOST at α_k (equivalent within ± margin); by the union bound P(any false verdict of a kind)
  <= Σ α_k = α over all looks, whatever the data do between them (conservative: looks are correlated).
- Studies (`holm`): Holm's step-down adjustment over the arms' comparisons on the primary metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

from orchestrator.stats import seed_interval

ALPHA = 0.05
SPENDING = ("obrien-fleming", "pocock")
VERDICTS = ("better", "worse", "equivalent", "inconclusive")


def spent(t: float, alpha: float = ALPHA, kind: str = "obrien-fleming") -> float:
    """α(t), the error spent by information fraction t in (0, 1]: α(1) = α."""
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if kind == "obrien-fleming":
        return float(2 * stats.norm.sf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    raise ValueError(f"spending: {kind!r} is not one of {', '.join(SPENDING)}")


def looks(first: int, add: int, max_seeds: int) -> list[int]:
    """The seed counts at which a confirmation looks: first, first + add, ..., and max_seeds last."""
    counts = list(range(first, max_seeds, add)) if add > 0 else [first]
    return [n for n in counts if n < max_seeds] + [max_seeds]


def look_alphas(counts: Sequence[int], alpha: float = ALPHA, kind: str = "obrien-fleming") -> list[float]:
    """α_k = α(n_k / n_K) - α(n_{k-1} / n_K): each look's share; they add up to α."""
    total = counts[-1]
    cumulative = [spent(n / total, alpha, kind) for n in counts]
    return [c - p for c, p in zip(cumulative, [0.0, *cumulative[:-1]])]


def t_bounds(diffs: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided 1 - α Student-t interval of the mean of paired differences
    (NaN bounds for one difference)."""
    interval = seed_interval(diffs, level=1 - alpha)
    return interval.mean, interval.low, interval.high


def paired_verdict(diffs: Sequence[float], alpha: float = ALPHA, margin: float | None = None, mode: str = "max") -> str:
    """better / worse: the 1 - α interval excludes 0 in the objective's direction; equivalent: TOST at α,
    the 1 - 2α interval inside (-margin, margin); otherwise inconclusive. One difference measures no
    seed spread: inconclusive."""
    mean, low, high = t_bounds(diffs, alpha)
    if math.isnan(low):
        return "inconclusive"
    if low > 0 or high < 0:
        return "better" if (low > 0) == (mode == "max") else "worse"
    if margin:
        _, low2, high2 = t_bounds(diffs, 2 * alpha)
        if -margin < low2 and high2 < margin:
            return "equivalent"
    return "inconclusive"


@dataclass(frozen=True)
class Look:
    """One look of a sequential confirmation: the differences so far, the look's share of α, its
    interval at that share, the verdict, and whether to stop (a verdict, or the last look)."""

    n: int
    alpha: float
    mean: float
    low: float
    high: float
    verdict: str
    stop: bool
    last: bool


def confirm_step(
    diffs: Sequence[float],
    counts: Sequence[int],
    alpha: float = ALPHA,
    margin: float | None = None,
    mode: str = "max",
    spending: str = "obrien-fleming",
) -> Look:
    """The decision at the look whose seed count is len(diffs) (one of `counts`)."""
    n = len(diffs)
    if n not in counts:
        raise ValueError(f"confirm_step: {n} differences is not a look ({list(counts)})")
    k = list(counts).index(n)
    share = look_alphas(counts, alpha, spending)[k]
    outcome = paired_verdict(diffs, share, margin, mode)
    mean, low, high = t_bounds(diffs, share)
    last = k == len(counts) - 1
    return Look(n, share, mean, low, high, outcome, outcome != "inconclusive" or last, last)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(pooled seed SD, its degrees of freedom) over groups of per-seed values; (nan, 0) without spread."""
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    if not df:
        return math.nan, 0
    squares = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in groups if len(g) > 1)
    return math.sqrt(squares / df), df


def prune(
    candidate: Sequence[float], rung: Mapping[str, Sequence[float]], level: float = 0.95, mode: str = "max"
) -> bool:
    """Stop `candidate` (its per-seed values at the rung) when its upper bound lies below the best lower
    bound among `rung` (the other configurations that reached the rung): mean ± t_{df} · s_p / √n,
    s_p the seed SD pooled over them and the candidate. Unmeasured noise (one seed each): never."""
    bounds = prune_bounds(candidate, rung, level, mode)
    return bounds is not None and bounds[0] < bounds[1]


def prune_bounds(
    candidate: Sequence[float], rung: Mapping[str, Sequence[float]], level: float = 0.95, mode: str = "max"
) -> tuple[float, float] | None:
    """(the candidate's bound nearest the best, the rung's best far bound), in the objective's sign
    (× -1 for mode min): what `prune` compares; None where the noise is unmeasured."""
    groups = [list(v) for v in rung.values()] + [list(candidate)]
    sd, df = pooled_sd(groups)
    if not df or not rung:
        return None
    sign = 1 if mode == "max" else -1
    t = float(stats.t.ppf(0.5 + level / 2, df))

    def bounds(values: Sequence[float]) -> tuple[float, float]:
        mean = sign * sum(values) / len(values)
        half = t * sd / math.sqrt(len(values))
        return mean - half, mean + half

    return bounds(candidate)[1], max(bounds(v)[0] for v in rung.values())


def paired_p(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test that the mean difference is 0 (nan below 2 differences;
    0 or 1 when the differences do not vary)."""
    n = len(diffs)
    if n < 2:
        return math.nan
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: p_(i) · (m - i + 1), made monotone, capped at 1 (nan stays)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m, adjusted, running = len(order), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, p * (m - rank)))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Confirmation:
    """A finished sequential confirmation: the fresh seeds, each arm's values on them, the last look."""

    seeds: list[int]
    winner: list[float]
    baseline: list[float]
    counts: list[int]
    look: Look

    @property
    def diffs(self) -> list[float]:
        return [a - b for a, b in zip(self.winner, self.baseline)]


def confirm(
    train,
    first_seed: int,
    counts: Sequence[int],
    alpha: float = ALPHA,
    margin: float | None = None,
    mode: str = "max",
    spending: str = "obrien-fleming",
) -> Confirmation:
    """Add seed pairs look by look until a look decides or the last look is reached. `train(seeds)`
    returns (the winner's values, the baseline's values) on those new seeds, in their order."""
    seeds: list[int] = []
    winner: list[float] = []
    baseline: list[float] = []
    for n in counts:
        new = list(range(first_seed + len(seeds), first_seed + n))
        a, b = train(new)
        seeds, winner, baseline = seeds + new, winner + list(a), baseline + list(b)
        look = confirm_step([x - y for x, y in zip(winner, baseline)], counts, alpha, margin, mode, spending)
        if look.stop:
            return Confirmation(seeds, winner, baseline, list(counts), look)
    raise AssertionError("the last look always stops")


def tost_p(diffs: Sequence[float], margin: float) -> float:
    """TOST's p-value for |mean difference| < margin: the larger of the two one-sided t-tests' p-values
    (H0: mean <= -margin, H0: mean >= margin); nan below 2 differences."""
    n = len(diffs)
    if n < 2:
        return math.nan
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) / math.sqrt(n)
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    return float(max(stats.t.sf((mean + margin) / se, n - 1), stats.t.cdf((mean - margin) / se, n - 1)))


def family_verdicts(
    diffs: Mapping[str, Sequence[float]], alpha: float = ALPHA, margin: float | None = None, mode: str = "max"
) -> dict[str, dict[str, float | str]]:
    """Each arm's verdict against the reference on the primary metric, Holm-adjusted over the arms:
    better / worse when its adjusted paired-t p-value is below α, equivalent when its adjusted TOST
    p-value is (with a margin), else inconclusive. Family-wise error <= α for each kind of claim."""
    names = list(diffs)
    p = holm([paired_p(diffs[n]) for n in names])
    p_eq = holm([tost_p(diffs[n], margin) for n in names]) if margin else [math.nan] * len(names)
    out = {}
    for name, p_diff, p_same in zip(names, p, p_eq):
        mean = sum(diffs[name]) / len(diffs[name])
        if p_diff < alpha:
            outcome = "better" if (mean > 0) == (mode == "max") else "worse"
        elif p_same < alpha:
            outcome = "equivalent"
        else:
            outcome = "inconclusive"
        out[name] = {"p_holm": p_diff, "p_equivalence_holm": p_same, "verdict": outcome}
    return out
