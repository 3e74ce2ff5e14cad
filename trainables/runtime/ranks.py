"""Reductions over a trial's learner ranks (its torch.distributed group); the identity on one rank."""

from __future__ import annotations

import torch
import torch.distributed as dist


def reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sum each value over ranks (keys must be equal on every rank)."""
    if not dist.is_initialized():
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def reduce_max(value: float) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def gather(items: list, world: int) -> list:
    """Every rank's items, in rank order, on every rank."""
    if not dist.is_initialized():
        return list(items)
    gathered = [None] * world
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def from_rank0(value):
    """Rank 0's value on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
