"""Weights from the learner to a rollout engine in buckets, over a torch.distributed group.

One collective per parameter costs a round trip each (hundreds for a 7B model); one buffer for the
whole model needs the model's size again in memory. So both sides agree on a plan (the tensors'
names, shapes and dtypes, sent once as an object) and the sender packs consecutive tensors into flat
byte buffers of at most `bucket_bytes`, one broadcast each: gloo between CPU processes, NCCL between
GPUs. The receiver gets each bucket as a name -> tensor dict, ready for an engine's weight loader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

ALIGN = 16  # bytes: every tensor starts at a multiple, so its bytes view back as its dtype


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size()

    @property
    def slot(self) -> int:
        """Bytes it takes in a bucket: nbytes rounded up to ALIGN."""
        return -(-self.nbytes // ALIGN) * ALIGN


def describe(state: Mapping[str, torch.Tensor]) -> list[TensorMeta]:
    return [TensorMeta(name, tuple(t.shape), t.dtype) for name, t in state.items()]


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int) -> list[list[TensorMeta]]:
    """Consecutive tensors in buckets of sum(slot) <= bucket_bytes; a larger tensor is a bucket alone."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[TensorMeta]] = []
    size = 0
    for meta in metas:
        if not buckets or size + meta.slot > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(meta)
        size += meta.slot
    return buckets


def pack(bucket: list[TensorMeta], state: Mapping[str, torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """One uint8 buffer [sum(slot)] holding the bucket's tensors' bytes, each at an ALIGN-ed offset."""
    buffer = torch.zeros(sum(m.slot for m in bucket), dtype=torch.uint8, device=device)
    offset = 0
    for meta in bucket:
        flat = state[meta.name].detach().contiguous().reshape(-1)
        buffer[offset : offset + meta.nbytes] = flat.view(torch.uint8)
        offset += meta.slot
    return buffer


def unpack(bucket: list[TensorMeta], buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The bucket's tensors, views into `buffer` with their names, shapes and dtypes."""
    out, offset = {}, 0
    for meta in bucket:
        out[meta.name] = buffer[offset : offset + meta.nbytes].view(meta.dtype).view(meta.shape)
        offset += meta.slot
    return out


def send_buckets(state: Mapping[str, torch.Tensor], *, src: int, bucket_bytes: int, group=None) -> int:
    """Broadcast `state` from rank `src` of `group` in buckets; returns how many buckets went."""
    metas = describe(state)
    dist.broadcast_object_list([metas], src=src, group=group)
    device = next(iter(state.values())).device if state else "cpu"
    buckets = plan_buckets(metas, bucket_bytes)
    for bucket in buckets:
        dist.broadcast(pack(bucket, state, device), src=src, group=group)
    return len(buckets)


def receive_buckets(*, src: int, bucket_bytes: int, group=None,
                    device: torch.device | str = "cpu") -> Iterator[dict[str, torch.Tensor]]:
    """The other side of `send_buckets`: yields each bucket as a name -> tensor dict as it arrives."""
    holder: list = [None]
    dist.broadcast_object_list(holder, src=src, group=group)
    for bucket in plan_buckets(holder[0], bucket_bytes):
        buffer = torch.empty(sum(m.slot for m in bucket), dtype=torch.uint8, device=device)
        dist.broadcast(buffer, src=src, group=group)
        yield unpack(bucket, buffer)
