"""The learner's weight push to the rollout engines, by `rollout.weight_transfer` (a key of `WEIGHT_PUSHES`):

- object_store: one copy in Ray's object store, fetched by each engine. Simple, survives anything,
  but the weights go through shared memory twice: fine on CPUs and for small models.
- gloo / nccl: learner rank 0 broadcasts to every engine over a group of their own, in buckets
  (the transport is trainables/rollout/weight_sync.py; nccl is vLLM's own weight transfer engine).
- ipc: colocated engines map the learner's GPU copy through CUDA IPC handles.

The weights go a bucket of `rollout.weight_bucket_mb` at a time, straight from the learner's
parameters (`learner_weights`): every learner rank makes each bucket (under ZeRO-3 a gather, a
collective; `prepare`, a collective for ipc), rank 0 sends it, and it is freed before the next, so no
rank ever holds a second copy of the whole model. A `RayActorError` or `WeightGroupError` on rank 0
means "push again" once a lost engine is back (`trainables.rollout.client` retries, every rank again).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist

from trainables import names
from trainables.names import same_names
from trainables.rollout.weight_sync import (
    IPC_INIT_INFO,
    NCCL_BUFFERS,
    TensorMeta,
    Weights,
    broadcast_errors,
    free_port,
    gloo_group,
    ipc_handles,
    ipc_update_info,
    nccl_init_info,
    plan_buckets,
    send_buckets,
    tensor_list,
)

GROUP_TIMEOUT_S = 120.0  # forming a group, and a broadcast waiting for a member
DEFAULT_BUCKET_BYTES = 256 * 2**20  # rollout.weight_bucket_mb's default (this room reads no config)


class WeightPush(ABC):
    """`push(weights, version)` on rank 0, for `Weights` whose buckets every learner rank makes
    (`learner_weights`: each bucket through `prepare`, then `release` once the push has moved on)."""

    def __init__(self, engines: list, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.engines, self.bucket_bytes = engines, bucket_bytes

    @classmethod
    def for_rollout(cls, engines: list, cfg) -> WeightPush:
        """The push to `engines`, set up from the rollout section (its bucket size, its engines' shards)."""
        return cls(engines, cfg.weight_bucket_mb * 2**20)

    def prepare(self, bucket: Mapping[str, torch.Tensor]):
        return bucket

    def release(self) -> None:
        """Every rank, once the push has asked for the next bucket: the last one may go."""

    def __call__(self, weights: Weights | Mapping[str, torch.Tensor], version: int) -> None:
        self.send(weights if isinstance(weights, Weights) else Weights.of(weights, self.bucket_bytes), version)

    @abstractmethod
    def send(self, weights: Weights, version: int) -> None:
        """Every bucket of `weights` to every engine, which then serves `version`."""


class ObjectStorePush(WeightPush):
    """The buckets in Ray's object store, fetched by every engine (`update_weights`); the store holds the
    model once (shared memory), the learner a bucket at a time."""

    def send(self, weights: Weights, version: int) -> None:
        # A copy of each: pickling a view (ZeRO 1/2 parameters are views into one flat buffer) ships its buffer.
        refs = [
            ray.put({name: t.detach().to("cpu", copy=True) for name, t in bucket.items()}) for bucket in weights.buckets
        ]
        # Nested in a list, the refs reach the actor unresolved, and it fetches the objects itself.
        ray.get([engine.update_weights.remote(refs, version) for engine in self.engines])


class GroupPush(WeightPush):
    """Learner rank 0 (group rank 0) broadcasts bucketed weights to every engine over a group of their
    own, formed on the first push and again after any failure (an engine Ray restarted is a new process).

    Subclasses say how the group forms on each side and how the bytes go: `GlooPush` on CPUs,
    `NcclPush` between GPUs through vLLM's weight transfer engine.
    """

    def __init__(self, engines: list, bucket_bytes: int, ranks_per_engine: int = 1):
        super().__init__(engines, bucket_bytes)
        self.ranks_per_engine = ranks_per_engine
        self.group = None
        self.names: set[str] | None = None

    @property
    def world_size(self) -> int:
        return 1 + self.ranks_per_engine * len(self.engines)

    def send(self, weights: Weights, version: int) -> None:
        try:
            if self.group is None:
                # A restarting engine refuses calls (RayActorError): the caller retries before this side
                # waits GROUP_TIMEOUT_S for a member that cannot come.
                ray.get([engine.health.remote() for engine in self.engines])
                host = ray.util.get_node_ip_address()
                port = free_port(host)
                # The engines' joins block until every member is there, this side's too: start them first.
                joins = [
                    self.join(engine, host, port, 1 + i * self.ranks_per_engine)
                    for i, engine in enumerate(self.engines)
                ]
                with broadcast_errors("forming the weight group"):
                    self.group = self.open(host, port)
                self.names = ray.get(joins)[0]  # the names an engine loads (None: all it is given)
            plan = weights.plan(self.names)  # what every engine is told to expect, built once
            receives = [self.receive(engine, plan, version) for engine in self.engines]
            with broadcast_errors("the weight broadcast"):
                self.broadcast(weights.buckets, plan)
            ray.get(receives)
        except BaseException:
            # Dropping this end closes its connections, which fails the other members' receives too;
            # the next push forms the group anew (an engine Ray restarted is a new process).
            self.group = None
            raise

    @abstractmethod
    def join(self, engine, host: str, port: int, rank_offset: int):
        """The engine's call joining the group at `rank_offset` (an ObjectRef: it blocks until all are
        in); its value is the set of tensor names the engine loads, or None for any."""

    @abstractmethod
    def open(self, host: str, port: int):
        """This side's end of the group, as rank 0."""

    @abstractmethod
    def receive(self, engine, plan: list[list[TensorMeta]], version: int):
        """The engine's call receiving the broadcast `plan` describes and loading it (an ObjectRef)."""

    @abstractmethod
    def broadcast(self, buckets: Iterator[Mapping[str, torch.Tensor]], plan: list[list[TensorMeta]]) -> None:
        """Broadcast the buckets' tensors that `plan` names, from rank 0."""


class GlooPush(GroupPush):
    """Buckets of `pack` broadcast over gloo; each engine receives them in its actor process."""

    def join(self, engine, host, port, rank_offset):
        return engine.join_weight_group.remote(host, port, rank_offset, self.world_size, GROUP_TIMEOUT_S)

    def open(self, host, port):
        return gloo_group(host, port, 0, self.world_size, GROUP_TIMEOUT_S)

    def receive(self, engine, plan, version):
        return engine.receive_weights.remote(plan, version)

    def broadcast(self, buckets, plan):
        send_buckets(buckets, plan, group=self.group)


class NcclPush(GroupPush):
    """vLLM's NCCL weight transfer (vLLM 0.32-0.33 API): the learner is rank 0 of a NCCL group with every
    worker of every engine (`ranks_per_engine` = tensor_parallel_size), broadcasting packed buffers of
    `bucket_bytes`, double buffered; the engines load them layer by layer (`VLLMEngine.transfer_weights`).
    The state's tensors stay on the learner's GPU."""

    @classmethod
    def for_rollout(cls, engines: list, cfg) -> WeightPush:
        return cls(engines, cfg.weight_bucket_mb * 2**20, ranks_per_engine=cfg.tensor_parallel_size)

    def join(self, engine, host, port, rank_offset):
        return engine.init_weight_transfer.remote(
            nccl_init_info(host, port, rank_offset, self.world_size, self.bucket_bytes)
        )

    def open(self, host, port):
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        return trainer_init({"master_address": host, "master_port": port, "world_size": self.world_size}, rank=0)

    def receive(self, engine, plan, version):
        return engine.transfer_weights.remote(tensor_list([m for bucket in plan for m in bucket]), version)

    def broadcast(self, buckets, plan):
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        # Each tensor is packed into vLLM's buffers as the iteration reaches it, before its bucket is freed.
        items = ((m.name, tensors[m.name]) for metas, tensors in zip(plan, buckets, strict=True) for m in metas)
        packed_nccl_broadcast_producer(
            items,
            self.group,
            src=0,
            post_iter_func=lambda item: item[1],
            buffer_size_bytes=self.bucket_bytes,
            num_buffers=NCCL_BUFFERS,
        )


class IpcPush(WeightPush):
    """Colocated engines (vLLM's IPC weight transfer, vLLM 0.32-0.33 API): no byte leaves the GPUs.

    Bucket by bucket, every learner rank holds the bucket's whole tensors on its GPU (`prepare`, a
    collective: under ZeRO 1/2 the parameters themselves, under ZeRO-3 a gather) and shares CUDA IPC
    handles of them, keyed by its GPU's UUID; the ranks all-gather the handles, rank 0 hands them to every
    engine, and each engine maps the tensors on its own GPU (a colocated engine shares a learner rank's
    GPU) and reloads them. The tensors must live until the engines are done: `release` is a barrier.
    """

    def __init__(self, engines: list, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        super().__init__(engines, bucket_bytes)
        self.names: set[str] | None = None  # set once the engines' transfer engines are up

    def prepare(self, bucket: Mapping[str, torch.Tensor]) -> dict:
        handles = ipc_handles(bucket)
        every_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, handles)
        merged = {name: {k: v for rank_handles in every_rank for k, v in rank_handles[name].items()} for name in bucket}
        return {"state": bucket, "handles": merged}

    def release(self) -> None:
        dist.barrier()

    def __call__(self, weights, version: int) -> None:
        if not isinstance(weights, Weights):  # a state dict in memory: prepared here, one bucket at a time
            plain = Weights.of(weights, self.bucket_bytes)
            weights = Weights(plain.metas, map(self.prepare, plain.buckets), plain.bucket_bytes)
        self.send(weights, version)

    def send(self, weights: Weights, version: int) -> None:
        try:
            if self.names is None:
                self.names = ray.get([engine.init_weight_transfer.remote(IPC_INIT_INFO) for engine in self.engines])[0]
            for prepared in weights.buckets:
                state = {name: t for name, t in prepared["state"].items() if name in self.names}
                if state:
                    update = ipc_update_info(state, prepared["handles"])
                    ray.get([engine.transfer_weights.remote(update, version) for engine in self.engines])
        except BaseException:
            self.names = None  # a restarted engine sets its transfer engine up again
            raise


@dataclass(frozen=True)
class Transfer:
    """A weight transfer of WEIGHT_PUSHES: its push, and what the learner and the engines ask of it."""

    push: type[WeightPush]
    on_gpu: bool  # sent from the learner's GPU: the learner keeps its state dict on the device
    engine_transfer: bool  # carried by vLLM's weight transfer engine, which the engine sets up at start


# rollout.weight_transfer -> its transfer; the config's choices are these keys, in this order.
WEIGHT_PUSHES: dict[str, Transfer] = {
    "object_store": Transfer(ObjectStorePush, on_gpu=False, engine_transfer=False),
    "gloo": Transfer(GlooPush, on_gpu=False, engine_transfer=False),
    "nccl": Transfer(NcclPush, on_gpu=True, engine_transfer=True),
    "ipc": Transfer(IpcPush, on_gpu=True, engine_transfer=True),
}
same_names(WEIGHT_PUSHES, names.WEIGHT_PUSHES, "weight transfers")
assert all(t.on_gpu == (names.PUSH_BUFFERS[name][1] == "device") for name, t in WEIGHT_PUSHES.items())
assert names.PUSH_BUFFERS["nccl"][0] == NCCL_BUFFERS


def weight_push(engines: list, cfg) -> WeightPush:
    """The learner's weight push for `rollout.weight_transfer` (cfg: the trial's RolloutConfig)."""
    return WEIGHT_PUSHES[cfg.weight_transfer].push.for_rollout(engines, cfg)


def learner_weights(learner, push: WeightPush, device: str | torch.device) -> Weights:
    """A learner rank's weights for `push`, made a bucket at a time on `device` (every rank iterates them
    all, in the same order: under ZeRO-3 each bucket is a gather); a bucket is released once the push asks
    for the next one."""
    metas = learner.weight_metas()

    def buckets() -> Iterator:
        for bucket in plan_buckets(metas, push.bucket_bytes):
            with learner.gathered([m.name for m in bucket], device) as tensors:
                yield push.prepare(tensors)
                push.release()

    return Weights(metas, buckets(), push.bucket_bytes)
