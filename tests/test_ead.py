"""EAD temperature schedule: hand-worked values, the floor, the decay, scalar vs vectorised."""

import math

import pytest
import torch

from trainables.rollout.ead import (
    MAX_DECAY,
    SCHEDULES,
    ead_decay,
    ead_temperature,
    ead_temperatures,
    fixed_temperature,
    tau_table,
)

RECIPE = dict(tau_max=1.2, tau_min=0.1, d0=25.0, warmup_tokens=10, time_scale=20.0)


def test_warmup_tokens_are_exactly_one():
    for t in range(10):
        assert ead_temperature(t, 0, **RECIPE) == 1.0
        assert ead_temperature(t, 500, **RECIPE) == 1.0


def test_first_annealed_token_hand_worked():
    # t = c = 10, step 0: 1 + 1.2 - exp(10 / (20 * 25)) = 2.2 - exp(0.02) = 2.2 - 1.0202013400...
    assert ead_temperature(10, 0, **RECIPE) == pytest.approx(1.17979865997, abs=1e-10)
    # t = 100, step 0: 2.2 - exp(100 / 500) = 2.2 - 1.2214027582 = 0.9785972418
    assert ead_temperature(100, 0, **RECIPE) == pytest.approx(0.9785972418, abs=1e-9)


def test_floor_reached_after_371_tokens_with_official_scale():
    # exp(t / 500) = 2.1 at t = 500 ln 2.1 = 370.97
    assert ead_temperature(370, 0, **RECIPE) == pytest.approx(2.2 - math.exp(0.74), abs=1e-12)
    assert ead_temperature(370, 0, **RECIPE) > 0.1
    assert ead_temperature(371, 0, **RECIPE) == 0.1
    assert ead_temperature(5000, 0, **RECIPE) == 0.1


def test_paper_formula_without_scale_reaches_floor_after_19_tokens():
    paper = {**RECIPE, "time_scale": 1.0}
    assert ead_temperature(18, 0, **paper) == pytest.approx(2.2 - math.exp(18 / 25), abs=1e-12)
    assert ead_temperature(19, 0, **paper) == 0.1


def test_huge_position_gives_floor_not_overflow():
    assert ead_temperature(10**9, 0, **RECIPE) == 0.1
    assert ead_temperatures(torch.tensor([10**9, 10**12]), 0, **RECIPE).tolist() == pytest.approx([0.1, 0.1])


def test_decay_grows_five_per_step_and_caps():
    assert ead_decay(0, d0=25.0) == 25.0
    assert ead_decay(10, d0=25.0) == 75.0
    assert ead_decay(10**9, d0=25.0) == MAX_DECAY == 40000


def test_later_steps_anneal_more_slowly():
    temps = [ead_temperature(200, s, **RECIPE) for s in (0, 10, 100, 1000)]
    assert all(a < b for a, b in zip(temps, temps[1:]))
    # step 100: d = 525, 2.2 - exp(100 / 10500)
    assert ead_temperature(100, 100, **RECIPE) == pytest.approx(2.2 - math.exp(100 / 10500), abs=1e-12)


PAPER_NO_WARMUP = {**RECIPE, "time_scale": 1.0, "warmup_tokens": 0, "tau_max": 1.0}


@pytest.mark.parametrize("step", [0, 7, 300, 10**6])
@pytest.mark.parametrize("params", [RECIPE, PAPER_NO_WARMUP])
def test_vectorised_equals_scalar_on_grid(step, params):
    positions = torch.arange(0, 2000, 7)  # long[B]
    fast = ead_temperatures(positions, step, **params)
    slow = torch.tensor([ead_temperature(int(t), step, **params) for t in positions], dtype=torch.float32)
    assert fast.dtype == torch.float32 and fast.shape == positions.shape
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-7)


def test_registry_one_signature():
    positions = torch.tensor([0, 10, 400])
    ead = SCHEDULES["ead"](positions, 0, **RECIPE)
    torch.testing.assert_close(ead, torch.tensor([1.0, 1.1797986599732444, 0.1]))
    fixed = SCHEDULES["fixed"](positions, 3, temperature=0.6)
    assert fixed.tolist() == pytest.approx([0.6] * 3)
    assert fixed_temperature(123, 3, temperature=0.6) == 0.6


def test_tau_table_is_the_schedule_at_every_position_of_the_cap():
    table = tau_table("ead", RECIPE, 7, 500)
    assert len(table) == 500  # t = 0 .. 499: the positions a 500-token response samples at
    schedule = SCHEDULES["ead"](torch.arange(500), 7, **RECIPE)
    assert torch.equal(torch.tensor(table), schedule)  # bit for bit: engines divide by these very values
    assert table[0] == 1.0 and table[-1] < table[10]  # warm-up at 1, then annealed
    assert tau_table("ead", dict(reversed(RECIPE.items())), 7, 500) is table  # computed once, shared
    assert tau_table("ead", RECIPE, 8, 500) != table  # the step-aware decay: another step, another table
    assert set(tau_table("fixed", {"temperature": 0.6}, 0, 3)) == {torch.tensor(0.6).item()}
