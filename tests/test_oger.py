"""OGER's reward and replacement against values worked out by hand."""

import math

import pytest
import torch

from trainables.rewards.oger import cosine_matrix, oger_rewards, replacement_indices

# Two offline trajectories along the axes; online ones at chosen angles (unnormalised on purpose).
OFFLINE = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
ONLINE = torch.tensor([[5.0, 0.0],    # s = (1, 0)          sim 0.5         D 0.5
                       [1.0, 1.0],    # s = (1/r2, 1/r2)    sim 1/r2        D 1 - 1/r2
                       [-4.0, 0.0]])  # s = (-1, 0)         sim -0.5        D 1.5
ENTROPY = torch.tensor([0.0, math.log(2.0), 1.0])
CORRECT = torch.tensor([1.0, 1.0, 0.0])


def test_cosine_does_not_assume_unit_vectors():
    expected = torch.tensor([[1.0, 0.0], [1 / math.sqrt(2), 1 / math.sqrt(2)], [-1.0, 0.0]])
    torch.testing.assert_close(cosine_matrix(ONLINE, OFFLINE), expected)


def test_oger_rewards_by_hand():
    out = oger_rewards(ONLINE, OFFLINE, ENTROPY, CORRECT)
    d1 = 1 - 1 / math.sqrt(2)
    torch.testing.assert_close(out["similarity"], torch.tensor([0.5, 1 / math.sqrt(2), -0.5]))
    torch.testing.assert_close(out["divergence"], torch.tensor([0.5, d1, 1.5]))
    # eq. 7: D * exp(-H) * R_m; exp(-log 2) = 1/2; the wrong answer gets 0 however divergent.
    torch.testing.assert_close(out["exploration"], torch.tensor([0.5, d1 / 2, 0.0]))
    torch.testing.assert_close(out["total"], torch.tensor([1.5, 1 + d1 / 2, 0.0]))


def test_without_refinement_the_entropy_is_ignored():
    out = oger_rewards(ONLINE, OFFLINE, ENTROPY, CORRECT, refine=False)
    d1 = 1 - 1 / math.sqrt(2)
    torch.testing.assert_close(out["exploration"], torch.tensor([0.5, d1, 0.0]))
    torch.testing.assert_close(out["total"], torch.tensor([1.5, 1 + d1, 0.0]))


def test_no_offline_trajectory_is_an_error():
    with pytest.raises(ValueError, match="offline_emb"):
        oger_rewards(ONLINE, torch.zeros(0, 2), ENTROPY, CORRECT)


@pytest.mark.parametrize("k, expected", [(0, []), (1, [1]), (2, [1, 3]), (3, [0, 1, 3])])
def test_replacement_takes_the_lowest_divergence_ties_to_the_lower_index(k, expected):
    divergence = torch.tensor([0.4, 0.1, 0.9, 0.1])  # indices 1 and 3 tie lowest
    assert replacement_indices(divergence, k).tolist() == expected


@pytest.mark.parametrize("k", [-1, 4])
def test_replacement_keeps_one_online_member(k):
    with pytest.raises(ValueError, match="replacement density"):
        replacement_indices(torch.zeros(4), k)
