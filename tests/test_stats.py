"""Golden tests of the uncertainty every sweep and study reports (orchestrator/stats.py): intervals over
seeds, paired differences, verdicts and the seeds a verdict would need, on hand-made numbers."""

from __future__ import annotations

import math

import pytest

from orchestrator.stats import MAX_SEEDS, describe, paired_difference, seed_interval, seeds_needed, seeds_text, verdict
from trainables.evaluation import avg_at_k_se


def test_interval_over_three_seeds_is_student_t():
    # mean 0.4, sd 0.1 (n - 1), t_{0.975, 2} = 4.302652729911275: half-width 4.3027 * 0.1 / sqrt(3) = 0.24841
    interval = seed_interval([0.3, 0.4, 0.5])
    assert interval.mean == pytest.approx(0.4) and interval.n == 3 and interval.source == "seeds"
    assert interval.low == pytest.approx(0.4 - 0.248414, abs=1e-6)
    assert interval.high == pytest.approx(0.4 + 0.248414, abs=1e-6)


def test_interval_over_two_seeds_uses_one_degree_of_freedom():
    # sd of (0.2, 0.4) = 0.141421; t_{0.975, 1} = 12.7062: half-width 12.7062 * 0.141421 / sqrt(2) = 1.27062
    interval = seed_interval([0.2, 0.4])
    assert interval.half_width == pytest.approx(1.270620, abs=1e-5)


def test_one_seed_falls_back_on_the_validation_error_and_says_so():
    interval = seed_interval([0.3], se=0.02)
    assert interval.source == "validation"
    assert (interval.low, interval.high) == pytest.approx((0.3 - 1.959964 * 0.02, 0.3 + 1.959964 * 0.02))
    assert "validation error only" in interval.format()
    bare = seed_interval([0.3])  # neither seeds nor a standard error: no interval at all
    assert math.isnan(bare.low) and bare.format() == "0.300"


def test_identical_arms_are_inconclusive():
    diff = paired_difference([0.3, 0.5, 0.4], [0.3, 0.5, 0.4])
    assert diff.mean == 0 and diff.low == 0 and diff.high == 0
    assert verdict(diff) == "inconclusive"
    assert seeds_needed([0.0, 0.0, 0.0]) == MAX_SEEDS


def test_one_arm_always_better_by_a_steady_margin():
    a, b = [0.52, 0.61, 0.47], [0.40, 0.50, 0.36]  # d = 0.12, 0.11, 0.11: sd 0.00577
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx(0.113333, abs=1e-6) and diff.low > 0
    assert verdict(diff, "max") == "better" and verdict(diff, "min") == "worse"
    assert verdict(paired_difference(b, a), "max") == "worse"
    # sqrt(2) * 19.6 = 27.7 >= t_{0.975, 1} + t_{0.8, 1} = 12.71 + 1.38: two seeds would already do
    assert seeds_needed([0.12, 0.11, 0.11]) == 2


def test_pairing_removes_the_shared_seed_noise():
    # The seeds move both arms together (0.2 to 0.6); unpaired intervals overlap, the paired one does not.
    a, b = [0.25, 0.45, 0.65], [0.2, 0.4, 0.6]
    assert seed_interval(a).low < seed_interval(b).high
    assert verdict(paired_difference(a, b)) == "better"


def test_noisy_difference_asks_for_more_seeds():
    diffs = [0.05, -0.02, 0.04]  # mean 0.0233, sd 0.0379: effect 0.616
    diff = paired_difference([0.4 + d for d in diffs], [0.4] * 3)
    assert verdict(diff) == "inconclusive"
    # n with sqrt(n) * 0.616 >= t_{0.975, n-1} + t_{0.8, n-1}: 23 (22 falls just short)
    assert seeds_needed(diffs) == 23
    assert seeds_needed([0.05]) is None  # one difference: no spread to estimate


def test_one_seed_difference_gives_an_interval_but_no_verdict():
    """One seed measures no seed spread: its interval is the validation's error only, and a verdict on it
    would say better or worse far more often than 5% under the null, so there is none."""
    diff = paired_difference([0.50], [0.40], se=0.02)
    assert diff.source == "validation" and diff.low == pytest.approx(0.1 - 1.959964 * 0.02, abs=1e-6)
    assert verdict(diff) == "inconclusive"
    assert "one seed measures no seed spread" in describe(diff, verdict(diff), None)
    with pytest.raises(ValueError, match="pair them seed by seed"):
        paired_difference([0.5, 0.4], [0.4])


def test_validation_standard_error_clusters_by_problem():
    # Problems' means 1, 0.5, 0, 0.5: sd 0.408248 (n - 1), / sqrt(4) = 0.204124
    correct = [[True, True], [True, False], [False, False], [False, True]]
    assert avg_at_k_se(correct) == pytest.approx(0.204124, abs=1e-6)
    assert math.isnan(avg_at_k_se([[True, False]]))  # one problem: no spread


def test_seeds_text_says_when_no_affordable_count_would_do():
    assert [seeds_text(n) for n in (None, 13, MAX_SEEDS)] == ["-", "13", f">= {MAX_SEEDS}"]


def test_seeds_needed_comes_with_its_range_and_its_test():
    """Post-hoc power from 3 differences: the standardized effect's 95% interval is wide, and so is the
    range of seeds it implies; a range that reaches 0 effect is unbounded."""
    from orchestrator.stats import seeds_range

    diffs = [0.05, -0.02, 0.04]
    low, high = seeds_range(diffs)
    assert low <= seeds_needed(diffs) and high == MAX_SEEDS
    line = describe(
        paired_difference([0.4 + d for d in diffs], [0.4] * 3), "inconclusive", seeds_needed(diffs), span=(low, high)
    )
    assert "alpha 0.05 two-sided" in line and "power 0.8" in line and "to unbounded" in line


def test_a_difference_too_steady_for_scipys_tails_gives_no_range_rather_than_an_error():
    from orchestrator.stats import effect_interval, seeds_range

    assert effect_interval([0.3, 0.30001]) is None and seeds_range([0.3, 0.30001]) is None  # t = 60,000, df 1
    low, high = effect_interval([0.3, 0.31, 0.32])  # t = 52, df 2: still within reach
    assert 0 < low < 31 < high
