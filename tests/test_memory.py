"""The memory pre-flight: parameter counts exact, ZeRO sharding as DeepSpeed partitions, and the learner's
estimate within 25% of the peak memory one real update takes on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainables.memory import GB, KNOWN_SHAPES, ModelShape, engine_memory, learner_memory

MEASURE = r"""
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from trainables.logprobs import token_logprobs

spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
torch.manual_seed(0)


def peak() -> int:  # peak RSS in bytes: VmHWM is this address space's (ru_maxrss keeps the parent's across exec)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def updates(config, rows, length, chunk, checkpointing):
    ids = torch.randint(config.vocab_size, (rows, length))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):  # the second update is the steady state: AdamW's states exist from the first step on
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
        logp, _ = token_logprobs(model.get_output_embeddings(), hidden, ids[:, 1:],
                                 torch.ones_like(ids[:, 1:], dtype=torch.bool), chunk_tokens=chunk, entropy="value")
        (-logp.mean()).backward()
        optimizer.step()
        del hidden, logp
    return sum(p.numel() for p in model.parameters())


# A tiny model through the same code first: the framework's own working memory (thread pools, kernels'
# scratch, lazily loaded modules) is then in the baseline, as a GPU's CUDA context is in the reserve.
updates(AutoConfig.for_model(**spec["warmup"]), 1, 16, 16, spec["checkpointing"])
base = peak()
params = updates(AutoConfig.for_model(**spec["config"]), spec["rows"], spec["length"], spec["chunk"], spec["checkpointing"])
print(json.dumps({"peak": peak() - base, "params": params}))
"""


def qwen2(hidden, layers, intermediate, heads, kv_heads, vocab, tied=True) -> dict:
    return {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": intermediate,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "vocab_size": vocab,
            "tie_word_embeddings": tied, "max_position_embeddings": 4096, "attn_implementation": "sdpa"}


# glibc keeps freed heap memory (and raises its mmap threshold as it goes), so the high-water mark would
# depend on the order of allocations; served by mmap, a freed tensor goes back at once and the peak RSS
# is the peak of live memory, as a GPU allocator's peak.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
WARMUP_MODEL = qwen2(32, 1, 64, 2, 1, 128)


def measure(config: dict, rows: int, length: int, chunk: int, checkpointing: bool) -> dict:
    """Peak RSS over two fp32 AdamW updates in a fresh process, less its peak before the model existed."""
    spec = {"config": config, "rows": rows, "length": length, "chunk": chunk, "checkpointing": checkpointing,
            "warmup": WARMUP_MODEL}
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(spec)], capture_output=True, text=True, check=True,
                         env={**os.environ, **MALLOC_ENV})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("config", "rows", "length", "chunk", "checkpointing"), [
    (qwen2(256, 4, 1024, 4, 2, 32000), 4, 512, 256, False),
    (qwen2(256, 4, 1024, 4, 2, 32000), 4, 512, 256, True),
    (qwen2(256, 4, 1024, 4, 2, 32000), 2, 512, 64, False),
    (qwen2(512, 2, 1536, 8, 2, 8000, tied=False), 2, 1024, 512, False),
])
def test_learner_estimate_is_within_a_quarter_of_a_real_update(config, rows, length, chunk, checkpointing):
    """fp32, one rank, no ZeRO: weights, gradients, AdamW's states, activations and one logits chunk."""
    shape = ModelShape.from_config(config)
    measured = measure(config, rows, length, chunk, checkpointing)
    assert measured["params"] == shape.params
    peak = measured["peak"]
    estimate = learner_memory(shape, dtype_bytes=4, zero_stage=0, world=1, tokens=rows * length,
                              gradient_checkpointing=checkpointing, chunk_tokens=chunk, reserve_gb=0.0).total
    assert abs(estimate - peak) <= 0.25 * peak, f"estimate {estimate / 2**20:.0f} MiB, measured {peak / 2**20:.0f} MiB"


def test_parameter_counts_are_exact():
    """Qwen2 (biases on q, k, v; tied or not) and Llama (no biases) shapes count every parameter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    for config in (qwen2(64, 2, 160, 4, 2, 300), qwen2(64, 3, 96, 8, 4, 120, tied=False),
                   {"model_type": "llama", "hidden_size": 48, "num_hidden_layers": 2, "intermediate_size": 128,
                    "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 200, "tie_word_embeddings": True}):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        assert ModelShape.from_config(config).params == sum(p.numel() for p in model.parameters()), config
    assert 1.5e9 < KNOWN_SHAPES["Qwen2.5-Math-1.5B"].params < 1.6e9  # 1.54 B as published
    assert 7.6e9 < KNOWN_SHAPES["Qwen2.5-Math-7B"].params < 7.7e9  # 7.62 B


def test_zero_stages_shard_what_deepspeed_shards():
    shape = KNOWN_SHAPES["Qwen2.5-Math-7B"]
    kw = dict(dtype_bytes=2, world=4, tokens=1, gradient_checkpointing=True, chunk_tokens=1, reserve_gb=0.0)
    p = shape.params
    by_stage = {z: learner_memory(shape, zero_stage=z, **kw) for z in range(4)}
    assert (by_stage[0].weights, by_stage[0].gradients, by_stage[0].optimizer) == (2 * p, 2 * p, 16 * p)
    assert by_stage[1].optimizer == 4 * p and by_stage[1].gradients == 2 * p
    assert by_stage[2].gradients == p / 2 and by_stage[2].weights == 2 * p
    assert by_stage[3].weights == p / 2
    eng = engine_memory(shape, dtype_bytes=2, tensor_parallel=2, gpu_gb=80, utilization=0.85, max_len=9216, sequences=64)
    assert eng.kv_per_sequence == 2 * 28 * 512 * 2 * 9216 / 2  # K = 4 heads x 128
    assert eng.concurrent == int((0.85 * 80 * GB * 0.95 - p) // eng.kv_per_sequence)
