"""The learner's weight push to the rollout engines, by `rollout.weight_transfer` (a key of `WEIGHT_PUSHES`):

- object_store: one copy in Ray's object store, fetched by each engine. Simple, survives anything,
  but the weights go through shared memory twice: fine on CPUs and for small models.
- gloo / nccl: learner rank 0 broadcasts to every engine over a group of their own, in buckets
  (the transport is trainables/rollout/weight_sync.py; nccl is vLLM's own weight transfer engine).
- ipc: colocated engines map the learner's GPU copy through CUDA IPC handles.

Every learner rank calls `push.prepare(state)` (a collective for ipc), then rank 0 calls
`push(prepared, version)`; a `RayActorError` or `WeightGroupError` means "push again" once a lost
engine is back (trainables/trial.py retries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist

from trainables import names
from trainables.names import same_names
from trainables.rollout.weight_sync import (IPC_INIT_INFO, NCCL_BUFFERS, broadcast_errors, describe, free_port,
                                            gloo_group, ipc_handles, ipc_update_info, nccl_init_info, send_buckets,
                                            tensor_list)

GROUP_TIMEOUT_S = 120.0  # forming a group, and a broadcast waiting for a member


class WeightPush:
    """`prepare(state)` on every learner rank, then `push(prepared, version)` on rank 0."""

    def __init__(self, engines: list):
        self.engines = engines

    @classmethod
    def for_rollout(cls, engines: list, cfg) -> WeightPush:
        """The push to `engines`, set up from the rollout section (its bucket size, its engines' shards)."""
        return cls(engines)

    def prepare(self, state: Mapping[str, torch.Tensor]):
        return state


class ObjectStorePush(WeightPush):
    """One copy of the weights in Ray's object store; every engine fetches it (`update_weights`)."""

    def __call__(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        ref = ray.put(dict(state))
        # Nested in a list, the ref reaches the actor unresolved, and it fetches the object itself.
        ray.get([engine.update_weights.remote([ref], version) for engine in self.engines])


class GroupPush(WeightPush, ABC):
    """Learner rank 0 (group rank 0) broadcasts bucketed weights to every engine over a group of their
    own, formed on the first push and again after any failure (an engine Ray restarted is a new process).

    Subclasses say how the group forms on each side and how the bytes go: `GlooPush` on CPUs,
    `NcclPush` between GPUs through vLLM's weight transfer engine.
    """

    def __init__(self, engines: list, bucket_bytes: int, ranks_per_engine: int = 1):
        super().__init__(engines)
        self.bucket_bytes, self.ranks_per_engine = bucket_bytes, ranks_per_engine
        self.group = None
        self.names: set[str] | None = None

    @classmethod
    def for_rollout(cls, engines: list, cfg) -> WeightPush:
        return cls(engines, cfg.weight_bucket_mb * 2**20)

    @property
    def world_size(self) -> int:
        return 1 + self.ranks_per_engine * len(self.engines)

    def __call__(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        try:
            if self.group is None:
                # A restarting engine refuses calls (RayActorError): the caller retries before this side
                # waits GROUP_TIMEOUT_S for a member that cannot come.
                ray.get([engine.health.remote() for engine in self.engines])
                host = ray.util.get_node_ip_address()
                port = free_port(host)
                # The engines' joins block until every member is there, this side's too: start them first.
                joins = [self.join(engine, host, port, 1 + i * self.ranks_per_engine)
                         for i, engine in enumerate(self.engines)]
                with broadcast_errors("forming the weight group"):
                    self.group = self.open(host, port)
                self.names = ray.get(joins)[0]  # the names an engine loads (None: all it is given)
            if self.names is not None:
                state = {name: tensor for name, tensor in state.items() if name in self.names}
            info = self.update_info(state)  # what every engine is told to expect, built once
            receives = [self.receive(engine, info, version) for engine in self.engines]
            with broadcast_errors("the weight broadcast"):
                self.send(state, info)
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
    def update_info(self, state: Mapping[str, torch.Tensor]):
        """The names, shapes and dtypes the receivers need, in the form their side takes."""

    @abstractmethod
    def receive(self, engine, info, version: int):
        """The engine's call receiving the broadcast `info` describes and loading it (an ObjectRef)."""

    @abstractmethod
    def send(self, state: Mapping[str, torch.Tensor], info) -> None:
        """Broadcast `state` from rank 0."""


class GlooPush(GroupPush):
    """Buckets of `pack` broadcast over gloo; each engine receives them in its actor process."""

    def join(self, engine, host, port, rank_offset):
        return engine.join_weight_group.remote(host, port, rank_offset, self.world_size, GROUP_TIMEOUT_S)

    def open(self, host, port):
        return gloo_group(host, port, 0, self.world_size, GROUP_TIMEOUT_S)

    def update_info(self, state):
        return describe(state)

    def receive(self, engine, info, version):
        return engine.receive_weights.remote(info, self.bucket_bytes, version)

    def send(self, state, info):
        send_buckets(state, info, group=self.group, bucket_bytes=self.bucket_bytes)


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
            nccl_init_info(host, port, rank_offset, self.world_size, self.bucket_bytes))

    def open(self, host, port):
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        return trainer_init({"master_address": host, "master_port": port, "world_size": self.world_size}, rank=0)

    def update_info(self, state):
        return tensor_list(state)

    def receive(self, engine, info, version):
        return engine.transfer_weights.remote(info, version)

    def send(self, state, info):
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        packed_nccl_broadcast_producer(iter(state.items()), self.group, src=0, post_iter_func=lambda item: item[1],
                                       buffer_size_bytes=self.bucket_bytes, num_buffers=NCCL_BUFFERS)


class IpcPush(WeightPush):
    """Colocated engines (vLLM's IPC weight transfer, vLLM 0.32-0.33 API): no byte leaves the GPUs.

    Every learner rank holds the full weights on its GPU (`prepare`, a collective): each shares CUDA
    IPC handles of its copy, keyed by its GPU's UUID, and the ranks all-gather them; rank 0 hands the
    merged handles to every engine, and each engine maps the copy on its own GPU (a colocated engine
    shares a learner rank's GPU) and reloads layer by layer. The copies must live until the engines are
    done: the sync's closing barrier holds them.
    """

    def __init__(self, engines: list):
        super().__init__(engines)
        self.names: set[str] | None = None  # set once the engines' transfer engines are up

    def prepare(self, state: Mapping[str, torch.Tensor]) -> dict:
        handles = ipc_handles(state)
        every_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, handles)
        merged = {name: {k: v for rank_handles in every_rank for k, v in rank_handles[name].items()}
                  for name in state}
        return {"state": state, "handles": merged}

    def __call__(self, prepared: dict, version: int) -> None:
        try:
            if self.names is None:
                self.names = ray.get([engine.init_weight_transfer.remote(IPC_INIT_INFO)
                                      for engine in self.engines])[0]
            state = {name: t for name, t in prepared["state"].items() if name in self.names}
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
assert {name for name, t in WEIGHT_PUSHES.items() if t.on_gpu} == set(names.PUSHES_FROM_DEVICE)
assert {name for name, t in WEIGHT_PUSHES.items() if issubclass(t.push, GroupPush)} == set(names.BUCKETED_PUSHES)


def weight_push(engines: list, cfg) -> WeightPush:
    """The learner's weight push for `rollout.weight_transfer` (cfg: the trial's RolloutConfig)."""
    return WEIGHT_PUSHES[cfg.weight_transfer].push.for_rollout(engines, cfg)
