"""The decisions bench's worlds (bench/simulated_sweeps.py): each knob's draw function on hand-made numbers, and
the world it builds measured over many seeds with a fixed generator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.simulated_sweeps import (
    BASE,
    FINAL,
    NEW,
    PROCEDURES,
    RUNG,
    STEPS,
    VAL_SE,
    VALIDATIONS,
    Knobs,
    World,
    correlated,
    curves,
    early_variance,
    one_sweep,
    rung_final_r,
    saved,
    search_config,
    seed_sds,
    shape,
    t_unit,
)

MANY = 200_000  # seeds drawn where a test measures an SD or a correlation


def finals(knobs: Knobs, means: list[float], seeds: int = MANY) -> np.ndarray:
    """[C, S]: each configuration's final values over `seeds` seeds, from a fixed generator."""
    return World(np.random.default_rng(7), knobs).draw(means, seeds)[..., -1]


def test_correlated_mixes_the_shared_and_own_draws_by_rho():
    own, common = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([5.0, 6.0])
    assert correlated(own, common, 1.0).tolist() == [[5.0, 6.0], [5.0, 6.0]]  # one draw for every configuration
    assert correlated(own, common, 0.0).tolist() == own.tolist()
    half = math.sqrt(0.5)
    assert correlated(own, common, 0.5) == pytest.approx(np.array([[6 * half, 8 * half], [8 * half, 10 * half]]))


def test_rho_one_gives_every_configuration_the_same_seeds():
    values = World(np.random.default_rng(0), Knobs(rho=1.0)).draw([FINAL] * 4, 5)  # [C, S, K]
    assert np.ptp(values, axis=0).max() == 0.0  # identical across configurations, seed by seed
    assert np.ptp(values[0, :, -1]) > 0  # and still different from seed to seed


def test_rho_is_the_correlation_of_two_configurations_final_values():
    for rho in (0.0, 0.5, 0.9):
        values = finals(Knobs(rho=rho), [FINAL] * 2)
        assert np.corrcoef(values)[0, 1] == pytest.approx(rho, abs=0.01)
        assert values.std(axis=1) == pytest.approx([0.04, 0.04], rel=0.01)  # the SD of each is untouched


def test_t_draws_are_scaled_to_sd_one():
    assert t_unit(np.array([3.0, -1.5]), 3) == pytest.approx([math.sqrt(3), -1.5 / math.sqrt(3)])
    assert t_unit(np.array([2.0]), 6)[0] == pytest.approx(2 * math.sqrt(2 / 3))


def test_student_t_seeds_keep_the_seed_sd_and_have_heavy_tails():
    t, normal = finals(Knobs(df=3), [FINAL])[0], finals(Knobs(), [FINAL])[0]
    assert t.std() == pytest.approx(0.04, rel=0.05)
    far_t, far_normal = (np.mean(np.abs(v - FINAL) > 4 * 0.04) for v in (t, normal))  # beyond 4 SDs
    assert far_normal < 2e-4 and far_t > 10 * far_normal + 1e-3


def test_only_the_best_challenger_is_noisier():
    assert seed_sds(np.array([0.4, 0.4, 0.48, 0.4]), 0.04, 2.0).tolist() == [0.04, 0.04, 0.08, 0.04]
    assert seed_sds(np.array([0.4, 0.42, 0.44, 0.46]), 0.04, 1.5).tolist() == [0.04, 0.04, 0.04, 0.06]
    assert seed_sds(np.array([0.4] * 4), 0.04, 2.0).tolist() == [0.04, 0.08, 0.04, 0.04]  # ties: the first
    assert seed_sds(np.array([0.5, 0.4, 0.4]), 0.04, 2.0).tolist() == [0.04, 0.08, 0.04]  # never the baseline
    values = finals(Knobs(noisy=2.0), [FINAL, FINAL, FINAL + 0.08, FINAL])
    assert values.std(axis=1) == pytest.approx([0.04, 0.04, 0.08, 0.04], rel=0.01)


def test_the_late_effect_lowers_the_rung_final_correlation_to_the_one_asked():
    s = float(shape(RUNG))
    for r in (0.3, 0.5):
        early = early_variance(r, np.array([0.04]), VAL_SE, s)
        assert rung_final_r(early, np.array([0.04]), VAL_SE, s) == pytest.approx([r])  # the root it solves
    for knobs, r in ((Knobs(), 0.662), (Knobs(rung_r=0.5), 0.5), (Knobs(rung_r=0.3, noisy=2.0), 0.3)):
        values = World(np.random.default_rng(3), knobs).draw([FINAL, FINAL + 0.04], MANY)[-1]  # the noisy one
        rung, final = values[:, list(VALIDATIONS).index(RUNG)], values[:, -1]
        assert np.corrcoef(rung, final)[0, 1] == pytest.approx(r, abs=0.01)
        assert final.std() == pytest.approx(knobs.sd * knobs.noisy, rel=0.01)  # the final SD kept
    with pytest.raises(ValueError, match="rung_r <= 0.06"):  # at sd 0.02 the validation noise is nearly all
        early_variance(0.5, np.array([0.02]), VAL_SE, s)


def test_curves_add_the_early_effect_along_the_curve_and_the_late_one_after_the_rung():
    steps = np.array([RUNG, STEPS])
    y = curves(np.array([0.4]), np.array([[0.01]]), np.array([[0.02]]), np.zeros((1, 1, 2)), steps)
    assert y[0, 0, 0] == pytest.approx(BASE + 0.2 * float(shape(RUNG)))  # the late effect not yet
    assert y[0, 0, 1] == pytest.approx(0.4 + 0.01 + 0.02)


@pytest.mark.parametrize(
    "knobs, fix",
    [
        ({"sd": 0.01}, "sd >= 0.019"),
        ({"rho": 1.5}, r"in \[0, 1\]"),
        ({"df": 2}, "df > 2"),
        ({"noisy": 0.5}, "at least 1"),
        ({"rung_r": 1.0}, r"in \(0, 1\)"),
    ],
)
def test_knobs_refuse_a_world_that_cannot_be_drawn(knobs, fix):
    with pytest.raises(ValueError, match=fix):
        Knobs(**knobs)


def test_the_rung_savings_are_a_paired_ratio():
    assert saved([1.0, 1.0], [2.0, 2.0]) == (0.5, 0.0)
    share, se = saved([1.0, 3.0], [2.0, 2.0])
    assert share == 0.0 and se == pytest.approx(0.5)  # SD of a - b, √2, over √n = √2, over mean(b) = 2


def test_identical_seeds_give_no_verdict_and_an_unpruned_sweep_its_full_cost():
    """rho 1 and all equal: every configuration has the same values, so the confirmation's differences are
    all zero (inconclusive, to its last look) and no rung stops anything; without a scheduler the sweep
    spends exactly 4 configurations x 2 seeds and 2 arms x 6 pairs, a run each of 30 steps."""
    for scheduler in ("intervals", "none"):
        search = search_config({**PROCEDURES[NEW], "scheduler": {"name": scheduler}})
        out = one_sweep(search, [FINAL] * 4, World(np.random.default_rng(1), Knobs(rho=1.0)))
        assert out.verdict == "inconclusive" and not out.pruned
        assert out.trial_steps == (4 * 2 + 2 * 6) * STEPS


def test_the_bench_default_is_the_shipped_spec():
    """The decisions the bench measures as "new" are those `make sweep` makes: its seeds, rungs and looks."""
    from orchestrator.spec import load_sweep_spec

    _, shipped, _ = load_sweep_spec("search_spaces/ead.yaml", check_files=False)
    new = search_config(PROCEDURES[NEW])
    assert (new.seeds, new.scheduler, new.confirm) == (shipped.seeds, shipped.scheduler, shipped.confirm)
