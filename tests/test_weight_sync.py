"""Weight transfer: the bucket plan, the byte packing of every dtype, a real two-process broadcast over
gloo, and the learner's gloo push to real engine actors, again after one of them was killed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray
import torch
import torch.multiprocessing as mp

from trainables.rollout.push import GlooPush, IpcPush, NcclPush, ObjectStorePush, weight_push
from trainables.rollout.weight_sync import (
    ALIGN,
    TensorMeta,
    WeightGroupError,
    Weights,
    describe,
    gloo_group,
    pack,
    plan_buckets,
    receive_buckets,
    send_buckets,
    unpack,
)


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


def _exchange(rank: int, port: int, out: str, bucket_bytes: int) -> None:
    group = gloo_group("127.0.0.1", port, rank, 2, timeout_s=60)
    weights = Weights.of(mixed_state(), bucket_bytes)
    plan = weights.plan(set(mixed_state()) - {"mask"})  # the receiver gets it through a Ray call in a trial
    if rank == 0:
        torch.save(send_buckets(weights.buckets, plan, group=group), out + ".count")
    else:
        received = {}
        for bucket in receive_buckets(plan, group=group):
            received.update({k: v.clone() for k, v in bucket.items()})
        torch.save(received, out)


def test_two_processes_exchange_the_weights_over_gloo(tmp_path, free_port):
    out = str(tmp_path / "received.pt")
    mp.start_processes(_exchange, args=(free_port, out, 96), nprocs=2, join=True, start_method="spawn")
    received, sent = torch.load(out), mixed_state()
    del sent["mask"]  # a tensor the engine does not take never crosses: its bucket (itself alone) is skipped
    assert torch.load(out + ".count") == len(plan_buckets(describe(sent), 96)) > 1
    assert list(received) == list(sent)
    for name, tensor in sent.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_weight_push_follows_the_spec():
    from trainables.config import RolloutConfig

    engines = ["engine-0", "engine-1"]
    for transfer, kind in (("object_store", ObjectStorePush), ("gloo", GlooPush), ("nccl", NcclPush), ("ipc", IpcPush)):
        push = weight_push(engines, RolloutConfig(weight_transfer=transfer, weight_bucket_mb=3, tensor_parallel_size=2))
        assert type(push) is kind and push.engines == engines, transfer
    gloo = weight_push(engines, RolloutConfig(weight_transfer="gloo", weight_bucket_mb=3))
    assert gloo.bucket_bytes == 3 * 2**20 and gloo.world_size == 3  # the learner, then one rank per engine
    assert weight_push(engines, RolloutConfig(weight_transfer="nccl", tensor_parallel_size=2)).world_size == 5
    state = mixed_state()
    assert gloo.prepare(state) is state  # only ipc's preparation is a collective


def push_until_done(push, state, version: int, deadline_s: float = 240) -> int:
    """Push as a learner does (trainables/trial.py): again after a lost engine; returns the failures."""
    failures, deadline = 0, time.monotonic() + deadline_s
    while True:
        try:
            push(state, version)
            return failures
        except (ray.exceptions.RayActorError, WeightGroupError):
            failures += 1
            assert time.monotonic() < deadline, "the engines never took the weights"
            time.sleep(2)


def exited(pid: int) -> bool:
    """Process `pid` is gone, or a zombie not yet reaped (its state follows the command's parenthesis)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until_gone(pid: int, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while not exited(pid):
        assert time.monotonic() < deadline, f"process {pid} outlived its kill"
        time.sleep(0.1)


def test_gloo_push_reaches_every_engine_and_survives_a_restart(ray_cluster, tiny_model_path):
    from transformers import AutoModelForCausalLM

    from trainables.config import RolloutConfig
    from trainables.rollout.service import start_rollout_service
    from trainables.rollout.types import SamplingSpec

    cfg = RolloutConfig(weight_transfer="gloo", weight_bucket_mb=1)
    engines = [start_rollout_service(cfg, tiny_model_path) for _ in range(3)]
    broadcast_to, reference = engines[:2], engines[2]
    push, by_object_store = weight_push(broadcast_to, cfg), ObjectStorePush([reference])
    assert isinstance(push, GlooPush) and isinstance(by_object_store, ObjectStorePush)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    g = torch.Generator().manual_seed(0)

    def trained(scale: float) -> dict[str, torch.Tensor]:  # stands in for a learner's next weights
        return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}

    spec = SamplingSpec("fixed", {"temperature": 1.0}, max_new_tokens=16, seed=3)
    prompts = [[5, 6, 7], [8, 9]]

    def outputs(engine, version):
        batch = ray.get(engine.generate.remote(prompts, 4, spec, version))
        return batch.response_ids, batch.behaviour_logprobs

    before = outputs(reference, 0)
    for version, scale in ((1, 0.05), (2, 0.1)):
        state = trained(scale)
        if version == 2:  # an engine dies: Ray restarts it with the initial weights, the group forms anew
            pid = ray.get(broadcast_to[0].health.remote())["pid"]
            ray.kill(broadcast_to[0], no_restart=False)
            wait_until_gone(pid)  # ray.kill returns before the process dies: a push could still reach it
            assert push_until_done(push, state, version) >= 1
        else:
            assert push_until_done(push, state, version) == 0
        by_object_store(state, version)
        expected = outputs(reference, version)
        assert expected != before
        for engine in broadcast_to:  # bit-equal to the weights that came through the object store
            assert outputs(engine, version) == expected
    assert ray.get(broadcast_to[0].health.remote())["weight_version"] == 2
    for engine in engines:
        ray.kill(engine)
