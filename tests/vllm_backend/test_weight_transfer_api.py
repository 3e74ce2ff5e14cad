"""The GPU weight transfers (`rollout.weight_transfer: nccl | ipc`, trainables/rollout/push.py) speak
vLLM's weight transfer API.

NCCL and CUDA IPC cannot run without a GPU, so this checks what the CPU build can: every vLLM name the
learner and the engine call exists with the arguments given, and vLLM's own info classes (which its
workers build with `cls(**dict)`, refusing unknown or missing fields) accept exactly the dicts sent.
"""

from __future__ import annotations

import inspect

import torch

from trainables.rollout.weight_sync import (
    IPC_INIT_INFO,
    NCCL_BUFFERS,
    describe,
    ipc_update_info,
    nccl_init_info,
    tensor_list,
)


def state() -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.zeros(8, 4), "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}


def test_nccl_infos_are_the_ones_vllm_parses():
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, trainer_init
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

    init = NCCLWeightTransferInitInfo(**nccl_init_info("10.0.0.1", 29600, 3, 5, 2**20))
    assert (init.rank_offset, init.world_size, init.packed) == (3, 5, True)
    assert (init.packed_buffer_size_bytes, init.packed_num_buffers) == (2**20, NCCL_BUFFERS)
    update = NCCLWeightTransferUpdateInfo(**tensor_list(describe(state())))
    assert update.dtype_names == ["float32", "bfloat16"] and update.shapes == [[8, 4], [4]]
    assert [getattr(torch, name) for name in update.dtype_names] == [t.dtype for t in state().values()]
    # The sender's calls (weight_sync.NcclPush), bound to vLLM's signatures.
    inspect.signature(trainer_init).bind({"master_address": "h", "master_port": 1, "world_size": 5}, rank=0)
    inspect.signature(packed_nccl_broadcast_producer).bind(
        iter(()), None, src=0, post_iter_func=lambda item: item[1], buffer_size_bytes=2**20, num_buffers=NCCL_BUFFERS
    )


def test_ipc_infos_are_the_ones_vllm_parses():
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo, IPCWeightTransferUpdateInfo

    assert IPCWeightTransferInitInfo(**IPC_INIT_INFO).packed is False
    handles = {name: {"GPU-a": ("args", i), "GPU-b": ("args", i)} for i, name in enumerate(state())}
    update = IPCWeightTransferUpdateInfo(**ipc_update_info(state(), handles))
    assert update.names == list(state()) and update.ipc_handles[1] == {"GPU-a": ("args", 1), "GPU-b": ("args", 1)}


def test_the_engine_calls_exist_on_vllms_llm():
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    assert (
        WeightTransferConfig(backend="nccl").backend == "nccl" and WeightTransferConfig(backend="ipc").backend == "ipc"
    )
    for method, args in (
        ("init_weight_transfer_engine", ({"init_info": IPC_INIT_INFO},)),
        ("start_weight_update", ()),
        ("update_weights", ({"update_info": tensor_list(describe(state()))},)),
        ("finish_weight_update", ()),
    ):
        inspect.signature(getattr(LLM, method)).bind(None, *args)  # None: self
