"""Micro-batches sized by tokens: every row once, within the budget, as many on every rank."""

from __future__ import annotations

import random

import pytest

from trainables.algo.batching import pad_tokens, split_to, token_budget_groups


def test_groups_fit_the_budget_and_hold_every_row_once():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(1, 400)
        groups = token_budget_groups(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for group in groups:
            assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= budget


def test_hand_worked_grouping_and_padding():
    lengths = [10, 40, 12, 38, 5]
    groups = token_budget_groups(lengths, 80)
    assert groups == [[1, 3], [2, 0, 4]]  # 2 x 40 = 80; 3 x 12 = 36
    assert pad_tokens(lengths, groups) == (80 + 36 - sum(lengths), 116)
    assert token_budget_groups([90, 10], 50) == [[0], [1]]  # a row over the budget goes alone


def test_split_to_a_common_count():
    groups = split_to([[0, 1, 2, 3], [4]], 4)
    assert len(groups) == 4 and sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert split_to([[0], [1]], 2) == [[0], [1]]
    with pytest.raises(ValueError, match="cannot split 2 rows into 3"):
        split_to([[0], [1]], 3)
