"""Micro-batches sized by tokens (verl's dynamic batch size): rows grouped so that a micro-batch's padded
size, rows x its longest row, stays within a budget.

The learner's loss is normalised by global counts (`trainables.algo.losses.aggregate_loss`), so any grouping
of the rows gives the same loss and gradient: only memory and padding change.
"""

from __future__ import annotations


def token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices in groups whose padded size len(group) * max length is <= budget (first fit, longest
    rows first, so rows of similar length share a micro-batch and little is padding). A row longer than
    the budget is a group of its own. Returns the groups, longest rows first; every row exactly once."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    groups: list[list[int]] = []
    widths: list[int] = []  # each group's longest row: its first, as rows come longest first
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for g, group in enumerate(groups):
            if (len(group) + 1) * widths[g] <= budget:
                group.append(row)
                break
        else:
            groups.append([row])
            widths.append(lengths[row])
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split (the largest first, in halves) until there are `count` of them: data-parallel ranks
    must run the same number of micro-batches (each is a collective under ZeRO-3). count <= total rows."""
    groups = [list(group) for group in groups]
    if count > sum(map(len, groups)):
        raise ValueError(f"cannot split {sum(map(len, groups))} rows into {count} micro-batches")
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda g: len(groups[g]))
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def pad_tokens(lengths: list[int], groups: list[list[int]]) -> tuple[int, int]:
    """(padding tokens, padded tokens) of micro-batches cut to their longest row: the learner's waste."""
    padded = sum(len(group) * max(lengths[i] for i in group) for group in groups if group)
    return padded - sum(lengths[i] for group in groups for i in group), padded
