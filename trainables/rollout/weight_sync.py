"""How weights travel from the learner to the rollout engines, on both sides: the transport, with no
Ray in it (trainables/rollout/push.py drives it from the learner; the engines receive in service.py).

One collective per parameter costs a round trip each (hundreds for a 7B model); one buffer for the
whole model needs the model's size again in memory. So both sides agree on a plan (the tensors'
names, shapes and dtypes, sent through the Ray call) and the sender packs consecutive tensors into
flat byte buffers of at most `bucket_bytes`, one broadcast each. The receiver gets each bucket as a
name -> tensor dict, ready for an engine's weight loader. Between GPUs vLLM's own NCCL transfer does
the same packing (double buffered) and loads each bucket as it lands. On the sending side the buckets
are made one at a time (`Weights`): a sharded learner gathers a bucket, it goes, it is freed.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
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


def pack(
    bucket: list[TensorMeta], state: Mapping[str, torch.Tensor], device: torch.device | str = "cpu"
) -> torch.Tensor:
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


@dataclass
class Weights:
    """A model's weights as a push takes them: `metas`, every tensor in order, and `buckets`, one name ->
    tensor dict per bucket of `plan_buckets(metas, bucket_bytes)`, each alive only until the next one is
    asked for (a learner gathers them one at a time: `trainables.rollout.push.learner_weights`)."""

    metas: list[TensorMeta]
    buckets: Iterator[Mapping[str, torch.Tensor]]
    bucket_bytes: int

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor], bucket_bytes: int) -> Weights:
        """A state dict already in memory, in buckets."""
        metas = describe(state)
        return cls(
            metas,
            ({m.name: state[m.name] for m in bucket} for bucket in plan_buckets(metas, bucket_bytes)),
            bucket_bytes,
        )

    def plan(self, names: set[str] | None = None) -> list[list[TensorMeta]]:
        """The buckets' metas, each kept to the tensors in `names` (None: all); a bucket may be left empty."""
        return [
            [m for m in bucket if names is None or m.name in names]
            for bucket in plan_buckets(self.metas, self.bucket_bytes)
        ]


def send_buckets(
    buckets: Iterable[Mapping[str, torch.Tensor]], plan: list[list[TensorMeta]], *, group, src: int = 0
) -> int:
    """Broadcast each bucket, packed as `plan` describes it (the tensors the receivers take of it, maybe
    none), from rank `src` of `group`; returns how many went. The receivers got `plan` another way (a Ray
    call's argument), so only tensor bytes cross the group."""
    sent = 0
    for metas, tensors in zip(plan, buckets, strict=True):
        if metas:
            dist.broadcast(pack(metas, tensors, tensors[metas[0].name].device), group=group, group_src=src)
            sent += 1
    return sent


def receive_buckets(
    plan: list[list[TensorMeta]], *, group, src: int = 0, device: torch.device | str = "cpu"
) -> Iterator[dict[str, torch.Tensor]]:
    """The other side of `send_buckets`: yields each bucket as a name -> tensor dict as it arrives."""
    for metas in plan:
        if metas:
            buffer = torch.empty(sum(m.slot for m in metas), dtype=torch.uint8, device=device)
            dist.broadcast(buffer, group=group, group_src=src)
            yield unpack(metas, buffer)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def gloo_group(host: str, port: int, rank: int, world_size: int, timeout_s: float):
    """A gloo process group of its own, outside torch's default one (a learner rank is already in Ray
    Train's): rank 0 hosts the rendezvous store at host:port, the others connect to it. Creating it
    blocks until all `world_size` members have joined."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


class WeightGroupError(RuntimeError):
    """A broadcast to the engines failed (a member left the group): push again, the group forms anew."""


@contextmanager
def broadcast_errors(what: str):
    """gloo's and NCCL's errors (a member left, or never came) as a WeightGroupError: push again."""
    try:
        yield
    except RuntimeError as e:
        raise WeightGroupError(f"{what} failed ({e})") from e


NCCL_BUFFERS = 2  # the packed NCCL transfer's double buffering; both sides must agree


# What the engines' vLLM workers parse into its NCCLWeightTransferInitInfo, NCCLWeightTransferUpdateInfo,
# IPCWeightTransferInitInfo and IPCWeightTransferUpdateInfo (tests/vllm_backend checks the fields).
def nccl_init_info(host: str, port: int, rank_offset: int, world_size: int, bucket_bytes: int) -> dict:
    return {
        "master_address": host,
        "master_port": port,
        "rank_offset": rank_offset,
        "world_size": world_size,
        "packed": True,
        "packed_buffer_size_bytes": bucket_bytes,
        "packed_num_buffers": NCCL_BUFFERS,
    }


IPC_INIT_INFO = {"packed": False}  # one handle per tensor: nothing to pack, nothing copied


def tensor_list(metas: list[TensorMeta]) -> dict[str, list]:
    """The names, dtype names and shapes of vLLM's weight update info, in the metas' order."""
    return {
        "names": [m.name for m in metas],
        "dtype_names": [str(m.dtype).removeprefix("torch.") for m in metas],
        "shapes": [list(m.shape) for m in metas],
    }


def ipc_update_info(state: Mapping[str, torch.Tensor], handles: Mapping[str, dict]) -> dict:
    """`tensor_list` and, per tensor, its CUDA IPC handle on each learner GPU {gpu uuid: handle args}."""
    return {**tensor_list(describe(state)), "ipc_handles": [dict(handles[name]) for name in state]}


def ipc_handles(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, tuple]]:
    """{name: {this GPU's UUID: the CUDA IPC handle's rebuild arguments}}: another process on the same
    GPU maps each tensor from them (vLLM's IPC weight transfer), nothing is copied."""
    from torch.multiprocessing.reductions import reduce_tensor

    gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return {name: {gpu: reduce_tensor(tensor)[1]} for name, tensor in state.items()}
