"""Golden tests, on hand-made numbers, of orchestrator.decisions and the pure core of orchestrator.scheduler."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from orchestrator import decisions as d
from orchestrator import stats as st
from orchestrator.scheduler import IntervalRungs, rungs, seed_values

Z975 = 1.959963984540054  # z_{0.975}, the textbook value


def sample_sd(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# --- spent, looks, look_alphas ---------------------------------------------------------------


def test_spent_at_full_information_equals_alpha():
    assert d.spent(1.0, 0.05, "obrien-fleming") == pytest.approx(0.05, rel=1e-12)
    assert d.spent(1.0, 0.05, "pocock") == pytest.approx(0.05, rel=1e-12)
    assert d.spent(1.0, 0.01, "obrien-fleming") == pytest.approx(0.01, rel=1e-12)


def test_spent_at_half_information_matches_closed_forms():
    obf = 2 - 2 * stats.norm.cdf(Z975 / math.sqrt(0.5))  # z/sqrt(t) = 2.7718 -> 0.005575
    pocock = 0.05 * math.log(1 + (math.e - 1) * 0.5)  # 0.05 * ln(1.8591) = 0.031006
    assert d.spent(0.5, 0.05, "obrien-fleming") == pytest.approx(obf, rel=1e-9)
    assert d.spent(0.5, 0.05, "obrien-fleming") == pytest.approx(0.005575, abs=1e-6)
    assert d.spent(0.5, 0.05, "pocock") == pytest.approx(pocock, rel=1e-12)
    assert d.spent(0.5, 0.05, "pocock") == pytest.approx(0.031006, abs=1e-6)


def test_spent_increases_with_information():
    grid = [0.1, 0.2, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0]
    for kind in d.SPENDING:
        values = [d.spent(t, 0.05, kind) for t in grid]
        assert all(a < b for a, b in zip(values, values[1:])), (kind, values)
        assert all(0 < v <= 0.05 + 1e-15 for v in values)


def test_spent_obrien_fleming_keeps_its_precision_at_small_information():
    # alpha(0.05) = 2 (1 - Phi(1.96 / sqrt(0.05))) = 2 Phi(-8.765) = 1.864e-18: positive, not rounded to 0;
    # a first look at 3 of 60 seeds (looks(3, 3, 60)) has exactly this information fraction
    exact = 2 * stats.norm.sf(Z975 / math.sqrt(0.05))
    assert exact == pytest.approx(1.864e-18, rel=1e-3, abs=0)
    assert d.spent(0.05, 0.05, "obrien-fleming") == pytest.approx(exact, rel=1e-6, abs=0)
    assert d.look_alphas(d.looks(3, 3, 60))[0] > 0


def test_spent_default_is_obrien_fleming():
    assert d.spent(0.5) == pytest.approx(2 - 2 * stats.norm.cdf(Z975 / math.sqrt(0.5)), rel=1e-9)


def test_spent_unknown_kind_raises():
    with pytest.raises(ValueError):
        d.spent(0.5, 0.05, "haybittle")


def test_looks_seed_counts():
    assert d.looks(3, 3, 6) == [3, 6]
    assert d.looks(3, 2, 8) == [3, 5, 7, 8]
    assert d.looks(3, 3, 3) == [3]
    assert d.looks(3, 3, 9) == [3, 6, 9]
    assert d.looks(5, 0, 5) == [5]


def test_look_alphas_sum_to_alpha_and_are_positive():
    for counts in ([3, 6], [3, 5, 7, 8], [3, 6, 9], [3]):
        for kind in d.SPENDING:
            shares = d.look_alphas(counts, 0.05, kind)
            assert len(shares) == len(counts)
            assert sum(shares) == pytest.approx(0.05, rel=1e-12)
            assert all(s > 0 for s in shares), (counts, kind, shares)


def test_look_alphas_two_looks_by_hand():
    first = 2 - 2 * stats.norm.cdf(Z975 / math.sqrt(0.5))
    assert d.look_alphas([3, 6]) == pytest.approx([first, 0.05 - first], rel=1e-9)
    first_pocock = 0.05 * math.log(1 + (math.e - 1) * 0.5)
    assert d.look_alphas([3, 6], 0.05, "pocock") == pytest.approx([first_pocock, 0.05 - first_pocock], rel=1e-9)


# --- t_bounds, paired_verdict -------------------------------------------------------------------


def test_t_bounds_by_hand():
    # mean 0.2, sd 0.1 (squares 0.01 + 0 + 0.01 over 2), half = t_{0.975,2} * 0.1 / sqrt(3)
    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)  # 4.302653 * 0.057735 = 0.248414
    mean, low, high = d.t_bounds([0.1, 0.2, 0.3], 0.05)
    assert mean == pytest.approx(0.2, abs=1e-12)
    assert low == pytest.approx(0.2 - half, abs=1e-9)
    assert high == pytest.approx(0.2 + half, abs=1e-9)
    assert low == pytest.approx(-0.048414, abs=1e-6)
    assert high == pytest.approx(0.448414, abs=1e-6)


def test_t_bounds_single_difference_has_no_interval():
    mean, low, high = d.t_bounds([0.3], 0.05)
    assert mean == 0.3 and math.isnan(low) and math.isnan(high)


def test_paired_verdict_clear_positive_is_better_for_max_and_worse_for_min():
    diffs = [1.0, 1.1, 0.9, 1.05]
    assert d.paired_verdict(diffs, 0.05, mode="max") == "better"
    assert d.paired_verdict(diffs, 0.05, mode="min") == "worse"
    negative = [-x for x in diffs]
    assert d.paired_verdict(negative, 0.05, mode="max") == "worse"
    assert d.paired_verdict(negative, 0.05, mode="min") == "better"


def test_paired_verdict_straddling_zero_is_inconclusive():
    assert d.paired_verdict([-1.0, 1.0, 0.5, -0.5], 0.05) == "inconclusive"
    assert d.paired_verdict([-1.0, 1.0, 0.5, -0.5], 0.05, margin=0.1) == "inconclusive"


def test_paired_verdict_equivalence_tost():
    diffs = [0.01, -0.01, 0.005, -0.005, 0.0]
    # by hand: mean 0, sd = sqrt(0.00025 / 4) = 0.0079057; 90% half = t_{0.95,4} * sd / sqrt(5) = 0.007537
    half90 = stats.t.ppf(0.95, 4) * math.sqrt(0.00025 / 4) / math.sqrt(5)
    assert half90 == pytest.approx(0.007537, abs=1e-6)
    assert d.paired_verdict(diffs, 0.05, margin=0.1) == "equivalent"
    assert d.paired_verdict(diffs, 0.05, margin=half90 * 1.01) == "equivalent"
    assert d.paired_verdict(diffs, 0.05, margin=half90 * 0.99) == "inconclusive"  # margin too small
    assert d.paired_verdict(diffs, 0.05, margin=0.001) == "inconclusive"
    assert d.paired_verdict(diffs, 0.05) == "inconclusive"  # no margin, no equivalence


def test_paired_verdict_single_difference_is_inconclusive():
    assert d.paired_verdict([5.0], 0.05) == "inconclusive"
    assert d.paired_verdict([0.0], 0.05, margin=1.0) == "inconclusive"


# --- confirm_step and confirm -----------------------------------------------------------------


def fake_train(winner_by_seed, baseline_by_seed, calls):
    def train(seeds):
        calls.append(list(seeds))
        return [winner_by_seed[s] for s in seeds], [baseline_by_seed[s] for s in seeds]

    return train


def test_confirm_clear_effect_stops_at_first_look():
    counts = [3, 6, 9]
    winner = {100 + i: 1.0 + 0.01 * (i % 3 - 1) for i in range(9)}  # diffs 0.99, 1.0, 1.01: t = 173
    baseline = {100 + i: 0.0 for i in range(9)}
    calls = []
    result = d.confirm(fake_train(winner, baseline, calls), 100, counts)
    assert calls == [[100, 101, 102]]
    assert result.seeds == [100, 101, 102]
    assert len(result.seeds) == counts[0]
    assert result.look.stop is True and result.look.last is False
    assert result.look.verdict == "better"
    assert result.look.n == 3
    # alpha of look 1 of [3, 6, 9]: 2 - 2 Phi(z_{0.975} * sqrt(3)) = 0.000687
    assert result.look.alpha == pytest.approx(2 - 2 * stats.norm.cdf(Z975 * math.sqrt(3)), rel=1e-9)
    assert result.look.alpha == pytest.approx(d.look_alphas(counts)[0], rel=1e-12)
    assert result.diffs == pytest.approx([0.99, 1.0, 1.01])


def test_confirm_undecided_effect_runs_to_last_look():
    counts = [3, 6, 9]
    pattern = [0.5, -0.4, 0.1, -0.3, 0.2, -0.1, 0.4, -0.5, 0.05]
    winner = {7 + i: pattern[i] for i in range(9)}
    baseline = {7 + i: 0.0 for i in range(9)}
    calls = []
    result = d.confirm(fake_train(winner, baseline, calls), 7, counts)
    assert calls == [[7, 8, 9], [10, 11, 12], [13, 14, 15]]
    flat = [s for call in calls for s in call]
    assert len(flat) == len(set(flat))  # no seed trained twice
    assert result.seeds == list(range(7, 16))
    assert result.look.verdict == "inconclusive"
    assert result.look.stop is True and result.look.last is True
    assert result.look.n == 9
    assert result.look.alpha == pytest.approx(d.look_alphas(counts)[2], rel=1e-12)
    assert result.diffs == pytest.approx(pattern)


def test_confirm_step_uses_the_looks_share_of_alpha():
    counts = [3, 6]
    first = 2 - 2 * stats.norm.cdf(Z975 / math.sqrt(0.5))  # 0.005575
    diffs = [0.3, -0.2, 0.1, 0.0, 0.2, -0.1]
    look1 = d.confirm_step(diffs[:3], counts)
    look2 = d.confirm_step(diffs, counts)
    assert look1.alpha == pytest.approx(first, rel=1e-9)
    assert look2.alpha == pytest.approx(0.05 - first, rel=1e-9)
    assert [look1.alpha, look2.alpha] == pytest.approx(d.look_alphas(counts), rel=1e-12)
    assert look1.stop is False and look1.last is False and look1.verdict == "inconclusive"
    assert look2.stop is True and look2.last is True and look2.verdict == "inconclusive"
    # the look's interval at its share, by hand: mean 0.05, sd of the six diffs, t_{1 - a2/2, 5}
    sd = sample_sd(diffs)
    half = stats.t.ppf(1 - (0.05 - first) / 2, 5) * sd / math.sqrt(6)
    assert look2.mean == pytest.approx(0.05, abs=1e-12)
    assert (look2.low, look2.high) == pytest.approx((0.05 - half, 0.05 + half), abs=1e-9)


def test_confirm_step_share_makes_a_difference_at_the_first_look():
    diffs = [1.0, 1.2, 1.1]  # mean 1.1, sd 0.1, t = 19.05, two-sided p = 0.0027
    assert d.paired_verdict(diffs, 0.05) == "better"
    look = d.confirm_step(diffs, [3, 6])  # share 0.005575 > p = 0.0027: better here too
    assert look.verdict == "better" and look.stop
    look3 = d.confirm_step(diffs, [3, 6, 9])  # share 0.000687 < p: not yet
    assert look3.verdict == "inconclusive" and not look3.stop


def test_confirm_step_rejects_a_count_that_is_not_a_look():
    with pytest.raises(ValueError):
        d.confirm_step([0.1, 0.2, 0.3, 0.4], [3, 6])
    with pytest.raises(ValueError):
        d.confirm_step([0.1, 0.2], [3, 6])


def test_confirm_step_equivalence_at_its_share():
    diffs = [0.001, -0.001, 0.0005, -0.0005, 0.0, 0.0002]
    look = d.confirm_step(diffs, [3, 6], margin=0.05)
    assert look.verdict == "equivalent" and look.stop


# --- the error bound, by simulation -------------------------------------------------------------


def test_sequential_error_rate_is_bounded_and_naive_looks_inflate_it():
    rng = np.random.default_rng(20240531)
    draws = rng.normal(0.0, 1.0, size=(4000, 6))  # true difference 0
    counts = [3, 6]
    sequential = naive = 0
    for row in draws.tolist():
        look = d.confirm_step(row[:3], counts)
        if not look.stop:
            look = d.confirm_step(row, counts)
        sequential += look.verdict != "inconclusive"
        naive += any(d.paired_verdict(row[:n], 0.05) != "inconclusive" for n in counts)
    rate, naive_rate = sequential / 4000, naive / 4000
    allowance = 3 * math.sqrt(0.05 * 0.95 / 4000)  # 0.0103
    assert rate <= 0.05 + allowance, rate
    assert naive_rate > rate, (naive_rate, rate)
    assert naive_rate > 0.05, naive_rate  # testing twice at full alpha overshoots alpha


# --- holm, paired_p -------------------------------------------------------------------------------


def test_holm_textbook_example():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04; cummax -> ..., 0.06
    assert d.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-12)


def test_holm_caps_at_one():
    # sorted 0.4, 0.7, 0.9 times 3, 2, 1 -> 1.2, 1.4, 0.9 -> capped 1, 1, then cummax keeps 1
    assert d.holm([0.4, 0.9, 0.7]) == pytest.approx([1.0, 1.0, 1.0])


def test_holm_nan_passes_through():
    # m = 2 non-NaN: 0.01 * 2 = 0.02, 0.04 * 1 = 0.04
    out = d.holm([0.01, math.nan, 0.04])
    assert math.isnan(out[1])
    assert [out[0], out[2]] == pytest.approx([0.02, 0.04], abs=1e-12)
    assert d.holm([]) == []


def test_paired_p_matches_scipy_one_sample_t_test():
    for diffs in ([0.1, 0.3, -0.05, 0.2], [1.0, 2.0, 3.5], [-0.4, -0.1, -0.3, 0.05, -0.2]):
        expected = stats.ttest_1samp(diffs, 0.0).pvalue
        assert d.paired_p(diffs) == pytest.approx(float(expected), rel=1e-9)


def test_paired_p_constant_and_short_differences():
    assert d.paired_p([0.5, 0.5, 0.5]) == 0.0
    assert d.paired_p([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(d.paired_p([0.2]))


# --- prune ------------------------------------------------------------------------------------------


def test_prune_far_below_a_tight_leader():
    assert d.prune([0.50, 0.51, 0.49], {"lead": [0.90, 0.91, 0.89]}) is True


def test_prune_keeps_a_candidate_within_the_noise():
    # pooled sd 0.05 (df 4), half = t_{0.975,4} * 0.05 / sqrt(3) = 0.0801: lead low 0.770 < cand high 0.870
    assert d.prune([0.84, 0.74, 0.79], {"lead": [0.90, 0.80, 0.85]}) is False


def test_prune_never_with_one_seed_each():
    assert d.prune([0.1], {"a": [0.9], "b": [0.95]}) is False


def test_prune_never_with_an_empty_rung():
    assert d.prune([0.1, 0.12], {}) is False


def test_prune_min_mirrors_max():
    rung = {"lead": [0.10, 0.11, 0.09], "mid": [0.3, 0.32, 0.28]}
    assert d.prune([0.50, 0.51, 0.49], rung, mode="min") is True
    assert d.prune([0.50, 0.51, 0.49], rung, mode="max") is False
    for cand in ([0.5, 0.51, 0.49], [0.12, 0.1, 0.11], [0.3, 0.2, 0.4]):
        flipped = {k: [-v for v in vs] for k, vs in rung.items()}
        assert d.prune([-v for v in cand], flipped, mode="min") == d.prune(cand, rung, mode="max")


def test_prune_at_the_boundary_by_hand():
    lead = [1.0, 1.2]
    # two groups of two seeds, each spread 0.2: squares 0.02 + 0.02 over df 2 -> s_p = sqrt(0.02)
    sp = math.sqrt((0.02 + 0.02) / 2)
    half = float(stats.t.ppf(0.975, 2)) * sp / math.sqrt(2)  # 4.302653 * 0.1 = 0.430265
    assert half == pytest.approx(0.430265, abs=1e-6)
    edge = (1.1 - half) - half  # candidate mean whose upper bound is the leader's lower bound: 0.239469
    below = edge - 1e-6
    above = edge + 1e-6
    assert d.prune([below - 0.1, below + 0.1], {"lead": lead}) is True
    assert d.prune([above - 0.1, above + 0.1], {"lead": lead}) is False
    # and at level 0.9 (t_{0.95,2} = 2.919986) the same 'above' candidate is pruned
    half90 = float(stats.t.ppf(0.95, 2)) * sp / math.sqrt(2)
    assert (above + half90) < (1.1 - half90)
    assert d.prune([above - 0.1, above + 0.1], {"lead": lead}, level=0.9) is True


def test_prune_best_lower_bound_is_the_maximum_over_the_rung():
    # a weak configuration in the rung must not shield the candidate from the strong one
    rung = {"weak": [0.1, 0.12], "strong": [0.9, 0.92]}
    assert d.prune([0.4, 0.42], rung) is True


# --- effect_interval, seeds_for_effect -----------------------------------------------------------


def test_effect_interval_brackets_the_observed_effect():
    for diffs in ([0.1, 0.3, 0.2, 0.25], [-1.0, 0.5, -0.3], [2.0, 2.1, 1.9, 2.05, 1.95]):
        low, high = st.effect_interval(diffs)
        observed = (sum(diffs) / len(diffs)) / sample_sd(diffs)
        assert low < observed < high, (diffs, low, observed, high)


def test_effect_interval_matches_noncentral_t_inversion():
    diffs = [0.0, 1.0, 2.0]  # mean 1, sd 1: observed effect 1, t = sqrt(3)
    n, df, t_obs = 3, 2, math.sqrt(3)

    def delta_at(q):  # P(T <= t_obs | noncentrality sqrt(n) * delta) = q
        return optimize.brentq(lambda x: stats.nct.cdf(t_obs, df, x * math.sqrt(n)) - q, -60.0, 60.0, xtol=1e-12)

    low, high = st.effect_interval(diffs, 0.95)
    assert low == pytest.approx(delta_at(0.975), abs=1e-6)
    assert high == pytest.approx(delta_at(0.025), abs=1e-6)
    assert low < 0 < 1 < high  # three pairs cannot rule out no effect
    narrower = st.effect_interval(diffs, 0.8)
    assert low < narrower[0] < narrower[1] < high


def test_effect_interval_none_without_spread():
    assert st.effect_interval([0.5]) is None
    assert st.effect_interval([0.5, 0.5, 0.5]) is None


def test_seeds_for_effect_zero_is_cap():
    assert st.seeds_for_effect(0) == 10_000
    assert st.seeds_for_effect(0.0, cap=50) == 50


def test_seeds_for_effect_larger_effects_need_fewer_seeds():
    ns = [st.seeds_for_effect(e) for e in (0.3, 0.5, 1.0, 2.0)]
    assert all(a > b for a, b in zip(ns, ns[1:])), ns
    assert st.seeds_for_effect(-1.0) == st.seeds_for_effect(1.0)
    assert st.seeds_for_effect(0.01, cap=20) == 20


def test_seeds_for_effect_one_by_hand():
    n = 2
    while math.sqrt(n) * 1.0 < stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1):
        n += 1
    # n = 9: 3.000 < 2.306 + 0.889; n = 10: 3.162 >= 2.262 + 0.883 = 3.145
    assert n == 10
    assert st.seeds_for_effect(1.0, 0.05, 0.8) == n


# --- scheduler: rungs, seed_values, IntervalRungs.decide -----------------------------------------


def test_rungs_asha_milestones():
    assert rungs(10, 3, 30) == [10]
    assert rungs(10, 2, 30) == [10, 20]
    assert rungs(10, 2, 100) == [10, 20, 40, 80]
    assert rungs(10, 2, 10) == []


def test_seed_values_in_seed_order():
    result = {
        "seeds/1/val/accuracy": 0.2,
        "seeds/10/val/accuracy": 0.4,
        "seeds/0/val/accuracy": 0.1,
        "seeds/2/val/accuracy": 0.3,
        "val/accuracy": 0.9,
        "seeds/0/val/accuracy_std": 7.0,
        "seeds/0/val/loss": 8.0,
        "progress/step": 10,
    }
    assert seed_values(result, "val/accuracy") == [0.1, 0.2, 0.3, 0.4]
    assert seed_values(result, "val/loss") == [8.0]
    assert seed_values({}, "val/accuracy") == []


def report(step, val_step, a, b):
    return {"progress/step": step, "progress/val_step": val_step, "seeds/0/val/accuracy": a, "seeds/1/val/accuracy": b}


def scheduler(milestones=(10,)):
    s = IntervalRungs(list(milestones), 0.95)
    s.set_search_properties("val/accuracy", "max")
    return s


def test_decide_first_configuration_continues():
    s = scheduler()
    assert s.decide("a", report(10, 10, 0.80, 0.82)) == "CONTINUE"
    assert s.rungs[10] == {"a": [0.80, 0.82]}
    assert s.stopped == {}


def test_decide_stops_a_configuration_far_below():
    s = scheduler()
    s.decide("a", report(10, 10, 0.80, 0.82))
    assert s.decide("b", report(10, 10, 0.10, 0.12)) == "STOP"
    assert s.stopped == {"b": 10}


def test_decide_keeps_a_close_configuration():
    s = scheduler()
    s.decide("a", report(10, 10, 0.80, 0.82))
    # pooled sd 0.01414 (df 2), half = 4.303 * 0.01 = 0.043: a low 0.767 < c high 0.843
    assert s.decide("c", report(10, 10, 0.79, 0.81)) == "CONTINUE"
    assert "c" not in s.stopped


def test_decide_waits_for_the_rung_step_and_its_validation():
    s = scheduler()
    s.decide("a", report(10, 10, 0.80, 0.82))
    assert s.decide("b", report(5, 5, 0.10, 0.12)) == "CONTINUE"  # before the rung step
    assert s.decide("b", report(12, 8, 0.10, 0.12)) == "CONTINUE"  # last validation before the rung
    assert "b" not in s.rungs[10] and s.stopped == {}
    assert s.decide("b", report(12, 12, 0.10, 0.12)) == "STOP"  # validated at/after the rung
    assert s.stopped == {"b": 10}  # the rung, not the step


def test_decide_each_rung_once_per_trial():
    s = scheduler((10, 20))
    s.decide("a", report(20, 20, 0.80, 0.82))
    assert set(s.rungs[10]) == {"a"} and set(s.rungs[20]) == {"a"}
    assert s.decide("c", report(10, 10, 0.79, 0.81)) == "CONTINUE"
    # c reaches rung 20 with values far below a's: stopped there, recorded as rung 20
    assert s.decide("c", report(20, 20, 0.10, 0.12)) == "STOP"
    assert s.stopped == {"c": 20}
    assert s.rungs[10]["c"] == [0.79, 0.81]


def test_decide_without_seed_values_continues():
    s = scheduler()
    s.decide("a", report(10, 10, 0.80, 0.82))
    assert s.decide("b", {"progress/step": 10, "progress/val_step": 10, "val/accuracy": 0.1}) == "CONTINUE"
    assert "b" not in s.rungs[10]


def test_decide_min_mode_mirrors():
    s = IntervalRungs([10], 0.95)
    s.set_search_properties("val/loss", "min")
    assert (
        s.decide(
            "a", {"progress/step": 10, "progress/val_step": 10, "seeds/0/val/loss": 0.10, "seeds/1/val/loss": 0.12}
        )
        == "CONTINUE"
    )
    assert (
        s.decide(
            "b", {"progress/step": 10, "progress/val_step": 10, "seeds/0/val/loss": 0.90, "seeds/1/val/loss": 0.92}
        )
        == "STOP"
    )
    assert (
        s.decide(
            "c", {"progress/step": 10, "progress/val_step": 10, "seeds/0/val/loss": 0.01, "seeds/1/val/loss": 0.03}
        )
        == "CONTINUE"
    )
