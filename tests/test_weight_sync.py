"""Bucketed weight transfer: the plan, the byte packing of every dtype, and a real two-process
broadcast over gloo (the CPU stand-in for NCCL between learner and engine GPUs)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainables.rollout.weight_sync import (ALIGN, TensorMeta, describe, pack, plan_buckets, receive_buckets,
                                            send_buckets, unpack)


def mixed_state() -> dict[str, torch.Tensor]:
    """Every dtype a model or its buffers may hold, odd sizes first so offsets need their alignment."""
    g = torch.Generator().manual_seed(0)
    return {
        "mask": torch.rand(7, generator=g) > 0.5,  # 7 bytes
        "embed.weight": torch.randn(13, 5, generator=g),
        "norm.weight": torch.randn(5, generator=g).to(torch.bfloat16),
        "ids": torch.arange(3, dtype=torch.int64),
        "scale": torch.tensor(0.5, dtype=torch.float16),  # 0-d
        "empty": torch.zeros(0, 4),
        "head.weight": torch.randn(4, 3, generator=g).double().t(),  # not contiguous
    }


def test_plan_keeps_order_and_bounds_every_bucket():
    metas = [TensorMeta(f"t{i}", (n,), torch.float32) for i, n in enumerate([10, 3, 40, 1, 1, 100, 2])]
    buckets = plan_buckets(metas, bucket_bytes=64)
    assert [m for bucket in buckets for m in bucket] == metas  # every tensor once, in order
    for bucket in buckets:
        assert len(bucket) == 1 or sum(m.slot for m in bucket) <= 64
    assert [[m.name for m in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"], ["t5"], ["t6"]]
    assert metas[5].nbytes == 400 and metas[5].slot == 400  # larger than a bucket: alone
    assert metas[1].slot == 16 and all(m.slot % ALIGN == 0 for m in metas)
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        plan_buckets(metas, 0)


def test_pack_and_unpack_round_trip_every_dtype():
    state = mixed_state()
    metas = describe(state)
    restored = {}
    for bucket in plan_buckets(metas, bucket_bytes=96):
        buffer = pack(bucket, state)
        assert buffer.dtype == torch.uint8 and buffer.numel() == sum(m.slot for m in bucket)
        restored.update(unpack(bucket, buffer))
    assert list(restored) == list(state)
    for name, tensor in state.items():
        assert restored[name].dtype == tensor.dtype and restored[name].shape == tensor.shape, name
        assert torch.equal(restored[name], tensor), name


def _exchange(rank: int, init_file: str, out: str, bucket_bytes: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        if rank == 0:
            torch.save(send_buckets(mixed_state(), src=0, bucket_bytes=bucket_bytes), out + ".count")
        else:
            received = {}
            for bucket in receive_buckets(src=0, bucket_bytes=bucket_bytes):
                received.update({k: v.clone() for k, v in bucket.items()})
            torch.save(received, out)
    finally:
        dist.destroy_process_group()


def test_two_processes_exchange_the_weights_over_gloo(tmp_path, monkeypatch):
    out = str(tmp_path / "received.pt")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # both processes on this machine
    mp.start_processes(_exchange, args=(str(tmp_path / "init"), out, 96), nprocs=2, join=True,
                       start_method="spawn")
    received, sent = torch.load(out), mixed_state()
    assert torch.load(out + ".count") == len(plan_buckets(describe(sent), 96)) > 1
    assert list(received) == list(sent)
    for name, tensor in sent.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
