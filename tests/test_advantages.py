"""Group advantages: hand-worked [2, 4] case, equal-reward groups, the zero-std metric."""

import pytest
import torch

from trainables.algo.advantages import GROUP_EPS, group_advantages, zero_std_fraction

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])  # [G=2, N=4]


def test_hand_worked_without_std():
    # means 0.5 and 0.75
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    torch.testing.assert_close(group_advantages(REWARDS, use_std=False), expected)


def test_hand_worked_with_unbiased_std():
    # group 0: unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735; group 1: var = 0.75 / 3, std = 0.5
    std0 = (1 / 3) ** 0.5
    a0 = 0.5 / (std0 + GROUP_EPS)
    a1 = 0.25 / (0.5 + GROUP_EPS)
    expected = torch.tensor([[a0, -a0, -a0, a0], [a1, a1, a1, -3 * a1]])
    torch.testing.assert_close(group_advantages(REWARDS, use_std=True), expected)
    assert a0 == pytest.approx(0.866024, abs=1e-5)


@pytest.mark.parametrize("use_std", [True, False])
def test_equal_reward_groups_give_exact_zeros(use_std):
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 1.0], [0.7, 0.7, 0.7], [0.0, 0.0, 0.0]])
    adv = group_advantages(rewards, use_std=use_std)
    assert torch.equal(adv[[0, 2, 3]], torch.zeros(3, 3))
    assert adv[1].abs().sum() > 0
    assert zero_std_fraction(rewards).item() == 0.75


def test_group_of_one_is_zero_not_nan():
    assert torch.equal(group_advantages(torch.tensor([[1.0], [0.0]]), use_std=True), torch.zeros(2, 1))


def test_zero_std_fraction_none_and_all():
    assert zero_std_fraction(REWARDS).item() == 0.0
    assert zero_std_fraction(torch.ones(5, 8)).item() == 1.0


def test_flat_rewards_raise_with_the_fix():
    with pytest.raises(ValueError, match="view"):
        group_advantages(torch.ones(8), use_std=True)
