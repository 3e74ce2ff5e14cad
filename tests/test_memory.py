"""The memory pre-flight: parameter counts exact, ZeRO sharding as DeepSpeed partitions, the learner's
estimate within 25% of the peak memory one real update takes on this CPU, the logits chunk's bytes as
measured, every term of the paper specs against a table worked by hand, and fixes that reach."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.preflight import learner_estimate, memory_report
from orchestrator.spec import load_trial_spec
from trainables.memory import CHUNK_BYTES, GIB, KNOWN_SHAPES, ModelShape, card_bytes, engine_memory, learner_memory

MEASURE = r"""
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from trainables.algo.logprobs import token_logprobs

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
config = AutoConfig.for_model(**spec["config"])
params = updates(config, spec["rows"], spec["length"], spec["chunk"], spec["checkpointing"])
print(json.dumps({"peak": peak() - base, "params": params}))
"""


def qwen2(hidden, layers, intermediate, heads, kv_heads, vocab, tied=True) -> dict:
    return {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 4096,
        "attn_implementation": "sdpa",
    }


# glibc keeps freed heap memory (and raises its mmap threshold as it goes), so the high-water mark would
# depend on the order of allocations; served by mmap, a freed tensor goes back at once and the peak RSS
# is the peak of live memory, as a GPU allocator's peak.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
WARMUP_MODEL = qwen2(32, 1, 64, 2, 1, 128)


def measure(config: dict, rows: int, length: int, chunk: int, checkpointing: bool) -> dict:
    """Peak RSS over two fp32 AdamW updates in a fresh process, less its peak before the model existed."""
    spec = {
        "config": config,
        "rows": rows,
        "length": length,
        "chunk": chunk,
        "checkpointing": checkpointing,
        "warmup": WARMUP_MODEL,
    }
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **MALLOC_ENV},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("config", "rows", "length", "chunk", "checkpointing"),
    [
        (qwen2(256, 4, 1024, 4, 2, 32000), 4, 512, 256, False),
        (qwen2(256, 4, 1024, 4, 2, 32000), 4, 512, 256, True),
        (qwen2(256, 4, 1024, 4, 2, 32000), 2, 512, 64, False),
        (qwen2(512, 2, 1536, 8, 2, 8000, tied=False), 2, 1024, 512, False),
    ],
)
def test_learner_estimate_is_within_a_quarter_of_a_real_update(config, rows, length, chunk, checkpointing):
    """fp32, one rank, no ZeRO: weights, gradients, AdamW's states, activations and one logits chunk."""
    shape = ModelShape.from_config(config)
    measured = measure(config, rows, length, chunk, checkpointing)
    assert measured["params"] == shape.params
    peak = measured["peak"]
    estimate = learner_memory(
        shape,
        dtype_bytes=4,
        zero_stage=0,
        world=1,
        tokens=rows * length,
        gradient_checkpointing=checkpointing,
        chunk_tokens=chunk,
        gpu=False,
    ).total
    assert abs(estimate - peak) <= 0.25 * peak, f"estimate {estimate / 2**20:.0f} MiB, measured {peak / 2**20:.0f} MiB"


def test_parameter_counts_are_exact():
    """Qwen2 (biases on q, k, v; tied or not) and Llama (no biases) shapes count every parameter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    for config in (
        qwen2(64, 2, 160, 4, 2, 300),
        qwen2(64, 3, 96, 8, 4, 120, tied=False),
        {
            "model_type": "llama",
            "hidden_size": 48,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "vocab_size": 200,
            "tie_word_embeddings": True,
        },
    ):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        assert ModelShape.from_config(config).params == sum(p.numel() for p in model.parameters()), config
    assert 1.5e9 < KNOWN_SHAPES["Qwen2.5-Math-1.5B"].params < 1.6e9  # 1.54 B as published
    assert 7.6e9 < KNOWN_SHAPES["Qwen2.5-Math-7B"].params < 7.7e9  # 7.62 B


def test_zero_stages_shard_what_deepspeed_shards():
    shape = KNOWN_SHAPES["Qwen2.5-Math-7B"]
    kw = dict(dtype_bytes=2, world=4, tokens=1, gradient_checkpointing=True, chunk_tokens=1, gpu=False)
    p = shape.params
    by_stage = {z: learner_memory(shape, zero_stage=z, **kw) for z in range(4)}
    # no ZeRO: the bf16 optimizer's fp32 master, m, v and fp32 gradients; ZeRO-1 on: master, m, v sharded
    assert (by_stage[0].weights, by_stage[0].gradients, by_stage[0].optimizer) == (2 * p, 2 * p, 16 * p)
    assert by_stage[1].optimizer == 3 * p and by_stage[1].gradients == 2 * p
    assert by_stage[2].gradients == p / 2 and by_stage[2].weights == 2 * p
    assert by_stage[3].weights == p / 2
    assert by_stage[2].step == 8 * p / 4 and by_stage[3].step == 8 * 10**9  # the partition; a ZeRO-3 sub-group
    eng = engine_memory(
        shape, dtype_bytes=2, tensor_parallel=2, gpu_gb=80, utilization=0.85, max_len=9216, sequences=64
    )
    assert eng.kv_per_sequence == 2 * 28 * 512 * 2 * 9216 / 2  # K = 4 heads x 128
    assert eng.concurrent == int((0.85 * 81_559 * 2**20 * 0.95 - p) // eng.kv_per_sequence)


CHUNK = r"""
import json, sys, torch
from trainables.algo.logprobs import token_logprobs
torch.set_num_threads(1)
dtype, entropy = getattr(torch, sys.argv[1]), sys.argv[2]


def peak() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def chunk(n, vocab, hidden=64):  # one chunk of n positions through the learner's pass, forward and backward
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dtype)
    h = torch.randn(1, n, hidden, dtype=dtype, requires_grad=True)
    logp, ent = token_logprobs(head, h, torch.randint(vocab, (1, n)), torch.ones(1, n, dtype=torch.bool),
                               torch.full((1, n), 1.1), chunk_tokens=n, entropy=entropy)
    (-logp.sum() + (0.01 * ent.sum() if entropy == "grad" else 0)).backward()


chunk(16, 128)
base = peak()
chunk(512, 32000)
print(json.dumps((peak() - base) / (512 * 32000)))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("entropy", list(CHUNK_BYTES))
def test_a_logits_chunk_costs_what_the_estimate_says(dtype, entropy):
    """Bytes per position x vocabulary entry of one chunk through `token_logprobs`, forward and backward, in a
    fresh process: 32 with the entropy in the graph, 16 with it as a value, 12 without, in either dtype."""
    out = subprocess.run(
        [sys.executable, "-c", CHUNK, dtype, entropy],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **MALLOC_ENV},
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(measured - CHUNK_BYTES[entropy]) <= 0.1 * CHUNK_BYTES[entropy], measured


# The paper specs' learner ranks, worked by hand (GiB; bf16, 18,432-token micro-batches, chunks of 1,024
# positions, the entropy bonus in the graph, checkpointing on, 4 ranks, a GPU rank, the weights pushed over
# NCCL in 1,024 MiB buckets, vLLM's two packing buffers on the learner's GPU).
# 1.5B: P = 1,543,714,304, V = 151,936, H = 1,536, I = 8,960, K = 256, L = 28, ZeRO-2.
#   weights 2P = 2.88; gradients 2P/4 = 0.72; optimizer 12P/4 = 4.31; step 8P/4 = 2.88;
#   logits chunk 1024 V 32 + 2 V H 2 = 4.64 + 0.87 = 5.51; layer inputs 18432 L H 2 = 1.48; a layer's
#   activations 18432 x 2 x (6H + 2K + 4I) = 1.56, twice 3.13 < 5.51: backward 1.48 + 5.51 = 6.98;
#   push: two packing buffers of a bucket, 2 x 1.00 = 2.00; reserve 1.5 + 5e8 x 2 = 2.43.
#   Peak: 2.88 + 0.72 + 4.31 + 6.98 (backward) + 2.43 = 17.32.
# 7B: P = 7,615,616,512, V = 152,064, H = 3,584, I = 18,944, K = 512, L = 28, ZeRO-3.
#   weights 2P/4 = 3.55; gradients 2P/4 = 3.55; optimizer 12P/4 = 21.28; step 8 x 1e9 (a sub-group) = 7.45;
#   logits chunk 4.64 + 2 V H 2 = 4.64 + 2.03 = 6.67; layer inputs 18432 L H 2 = 3.45; twice a layer's
#   activations 6.75 > 6.67: backward 3.45 + 6.75 = 10.20; push: the embedding (V H 2 = 1.015) is larger
#   than a bucket, so a bucket is 1.015: one gathered, two packing buffers, 3.05;
#   reserve 1.5 + (5e8 + 1e9) x 2 = 4.29.
#   Peak: 3.55 + 3.55 + 21.28 + 10.20 (backward) + 4.29 = 42.86.
HAND = {
    "grpo_qwen2.5_math_1.5b": dict(
        weights=2.88,
        gradients=0.72,
        optimizer=4.31,
        step=2.88,
        logits=5.51,
        activations=6.98,
        push=2.00,
        reserve=2.43,
        total=17.32,
        peak_phase="backward",
    ),
    "grpo_qwen2.5_math_7b": dict(
        weights=3.55,
        gradients=3.55,
        optimizer=21.28,
        step=7.45,
        logits=6.67,
        activations=10.20,
        push=3.05,
        reserve=4.29,
        total=42.86,
        peak_phase="backward",
    ),
}
PAPER = Path(__file__).resolve().parent.parent / "search_spaces" / "paper"


@pytest.mark.parametrize("spec", list(HAND))
def test_paper_specs_learner_terms_match_the_hand_worked_table(spec):
    cfg = load_trial_spec(PAPER / f"{spec}.yaml", check_files=False)
    mem = learner_estimate(cfg, KNOWN_SHAPES[cfg.model.path.rsplit("/", 1)[-1]], 2)()
    for term, hand in HAND[spec].items():
        value = getattr(mem, term)
        assert (value == hand) if isinstance(hand, str) else abs(value / GIB - hand) < 0.006, (term, value / GIB, hand)
    report = memory_report(cfg)
    assert f"{HAND[spec]['total']:.2f} GiB = " in report and "learner: fits" in report


def test_cards_are_taken_at_the_size_they_report():
    assert card_bytes(80)[0] == 81_559 * 2**20 and "79.6 GiB as the card reports" in card_bytes(80)[1]
    assert card_bytes(141)[0] / GIB > 140 and card_bytes(24)[0] == 24 * 10**9


def test_a_spec_that_does_not_fit_is_told_a_fix_that_reaches():
    """7B on one 80 GB rank: the states alone exceed the card, so no token budget can fix it; what can is
    named (more ranks, that take whole prompt groups), and the named fix does fit. A spec whose activations
    are the excess is told the largest token budget that fits, never one below a single row; one whose
    logits chunk is the excess, a smaller chunk."""
    over = ["learner.num_workers=1", "rollout.num_engines=1", "learner.gpu_memory_gb=80"]
    cfg = load_trial_spec(PAPER / "grpo_qwen2.5_math_7b.yaml", over, check_files=False)
    report = memory_report(cfg)
    assert "WILL NOT FIT" in report and "max_tokens_per_micro_batch" not in report
    (world,) = [int(w) for w in re.findall(r"learner\.num_workers: (\d+)", report)]
    fixed = load_trial_spec(
        PAPER / "grpo_qwen2.5_math_7b.yaml", over + [f"learner.num_workers={world}"], check_files=False
    )
    assert "learner: fits" in memory_report(fixed)
    tight = ["learner.max_tokens_per_micro_batch=200000", "learner.gpu_memory_gb=24"]
    cfg = load_trial_spec(PAPER / "grpo_qwen2.5_math_1.5b.yaml", tight + ["learner.num_workers=8"], check_files=False)
    report = memory_report(cfg)
    budget = int(re.search(r"max_tokens_per_micro_batch: (\d+)", report).group(1))
    assert budget >= 1024 + 8192
    fixed = load_trial_spec(
        PAPER / "grpo_qwen2.5_math_1.5b.yaml",
        tight + ["learner.num_workers=8", f"learner.max_tokens_per_micro_batch={budget}"],
        check_files=False,
    )
    assert "learner: fits" in memory_report(fixed)
    wide = load_trial_spec(
        PAPER / "grpo_qwen2.5_math_1.5b.yaml",
        ["learner.logits_chunk_tokens=16384", "learner.gpu_memory_gb=40"],
        check_files=False,
    )
    assert "WILL NOT FIT. learner.logits_chunk_tokens: 2048 brings it to" in memory_report(wide)


def test_a_colocated_engine_and_learner_are_summed_on_their_card():
    """Each alone fits a 141 GB card; the engine at 0.85 of it beside the learner's states does not, and the
    utilization that leaves the learner its room is named."""
    over = [
        "rollout.colocate=true",
        "rollout.num_gpus=0.5",
        "rollout.tensor_parallel_size=1",
        "rollout.weight_transfer=ipc",
    ]
    cfg = load_trial_spec(PAPER / "grpo_qwen2.5_math_7b.yaml", over, check_files=False)
    report = memory_report(cfg)
    assert "learner: fits" in report and "rollout engine: fits" in report
    assert "colocated: WILL NOT FIT. rollout.gpu_memory_utilization <= 0." in report
    room = float(re.search(r"gpu_memory_utilization <= (0\.\d+)", report).group(1))
    fixed = load_trial_spec(
        PAPER / "grpo_qwen2.5_math_7b.yaml", over + [f"rollout.gpu_memory_utilization={room}"], check_files=False
    )
    assert "colocated: fits" in memory_report(fixed)
