"""OGER's reward and replacement against values worked out by hand."""

import math

import pytest
import torch

from trainables.algo.hybrid import group_divergence, hybrid_rewards
from trainables.rewards.oger import cosine_matrix, divergence, replacement_indices

# Two offline trajectories along the axes; online ones at chosen angles (unnormalised on purpose).
OFFLINE = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
ONLINE = torch.tensor(
    [
        [5.0, 0.0],  # s = (1, 0)          sim 0.5         D 0.5
        [1.0, 1.0],  # s = (1/r2, 1/r2)    sim 1/r2        D 1 - 1/r2
        [-4.0, 0.0],
    ]
)  # s = (-1, 0)         sim -0.5        D 1.5
ENTROPY = torch.tensor([0.0, math.log(2.0), 1.0])
CORRECT = torch.tensor([1.0, 1.0, 0.0])


def test_cosine_does_not_assume_unit_vectors():
    expected = torch.tensor([[1.0, 0.0], [1 / math.sqrt(2), 1 / math.sqrt(2)], [-1.0, 0.0]])
    torch.testing.assert_close(cosine_matrix(ONLINE, OFFLINE), expected)


D1 = 1 - 1 / math.sqrt(2)


def test_divergence_by_hand():
    similarity, d = divergence(ONLINE, OFFLINE)
    torch.testing.assert_close(similarity, torch.tensor([0.5, 1 / math.sqrt(2), -0.5]))
    torch.testing.assert_close(d, torch.tensor([0.5, D1, 1.5]))


@pytest.mark.parametrize(
    "refine, exploration",
    [
        (True, [0.5, D1 / 2, 0.0]),  # eq. 7: D * exp(-H) * R_m; exp(-log 2) = 1/2; a wrong answer gets 0
        (False, [0.5, D1, 0.0]),  # without refinement the entropy is ignored
    ],
)
def test_oger_rewards_by_hand(refine, exploration):
    """What the trial computes (`hybrid_rewards` of `group_divergence`) for one group of 3 and k = 1."""
    d = group_divergence(ONLINE, [OFFLINE], n=3)  # [1, 3]
    rewards, replaced, r_oger = hybrid_rewards(
        CORRECT[None], ENTROPY[None], d, k=1, lowest_divergence=True, exploration=True, refine=refine
    )
    torch.testing.assert_close(r_oger[0], torch.tensor(exploration))
    torch.testing.assert_close(rewards[0], CORRECT + torch.tensor(exploration))  # eq. 8
    assert replaced.tolist() == [[1]]  # the lowest D


def test_a_group_without_offline_trajectories_has_no_oger_reward():
    d = group_divergence(torch.cat([ONLINE, ONLINE]), [None, OFFLINE], n=3)
    rewards, _, r_oger = hybrid_rewards(
        CORRECT.repeat(2, 1), ENTROPY.repeat(2, 1), d, k=1, lowest_divergence=True, exploration=True, refine=True
    )
    assert (d[0] == 0).all() and (r_oger[0] == 0).all() and torch.equal(rewards[0], CORRECT)
    assert (r_oger[1] > 0).sum() == 2


@pytest.mark.parametrize("k, expected", [(0, []), (1, [1]), (2, [1, 3]), (3, [0, 1, 3])])
def test_replacement_takes_the_lowest_divergence_ties_to_the_lower_index(k, expected):
    divergence = torch.tensor([0.4, 0.1, 0.9, 0.1])  # indices 1 and 3 tie lowest
    assert replacement_indices(divergence, k).tolist() == expected


@pytest.mark.parametrize("k", [-1, 4])
def test_replacement_keeps_one_online_member(k):
    with pytest.raises(ValueError, match="replacement density"):
        replacement_indices(torch.zeros(4), k)
