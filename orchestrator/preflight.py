"""The memory pre-flight of `--dry-run`: will a spec's learner ranks and rollout engines fit their GPUs?

Reads the model's shape from its config.json (the paper specs' Qwen2.5-Math shapes are known when their
folders are not mounted here) and prints the estimate of `trainables.memory` against
`learner.gpu_memory_gb`, with the knob that fixes a spec that does not fit.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainables.config import TrialConfig
from trainables.names import SMOLLM2_PRESET, TINY_MAX_POSITIONS, TINY_PRESET
from trainables.memory import GB, GIB, KNOWN_SHAPES, ModelShape, engine_memory, learner_memory

PROMPT_TOKENS = {"offline_prompts": 1024, "arithmetic": 128}  # a longest row's prompt allowance, by task
# (LUFFY's max_prompt_length for real data; the built-in task's prompts are a few dozen tokens)
PRESET_SHAPES = {  # the built-in presets' shapes (the tiny one comes from its spec section)
    SMOLLM2_PRESET: ModelShape(576, 30, 1536, 9, 3, 49152, tied=True, attention_bias=False),
}


PRESET_POSITIONS = {TINY_PRESET: TINY_MAX_POSITIONS, SMOLLM2_PRESET: 8192}


def model_shape(cfg: TrialConfig) -> tuple[ModelShape | None, str]:
    """(shape, where it came from), or (None, why not)."""
    if cfg.model.path is None:
        if cfg.model.preset == TINY_PRESET:
            t = cfg.model.tiny
            return ModelShape(t.hidden_size, t.num_layers, t.intermediate_size, t.num_heads, t.num_kv_heads,
                              t.vocab_size, tied=True), "the tiny preset"
        return PRESET_SHAPES[cfg.model.preset], f"the {cfg.model.preset} preset"
    folder = Path(cfg.model.path).expanduser()
    if (folder / "config.json").is_file():
        config = {**json.loads((folder / "config.json").read_text()), **cfg.model.config_overrides}
        try:
            return ModelShape.from_config(config), f"{folder}/config.json"
        except KeyError as e:
            return None, f"{folder}/config.json has no {e} (not a decoder-only transformer config)"
    if folder.name in KNOWN_SHAPES:
        return KNOWN_SHAPES[folder.name], f"{folder.name}'s published config (the folder is not here)"
    return None, f"{folder} has no config.json here"


def model_positions(cfg: TrialConfig) -> tuple[int | None, str]:
    """(the policy's max_position_embeddings, where it came from): its config overrides, its config.json, or
    a preset's; None where this machine cannot know it (a folder that is not here)."""
    override = cfg.model.config_overrides.get("max_position_embeddings")
    if isinstance(override, int) and not isinstance(override, bool):
        return override, "model.config_overrides"
    if cfg.model.path is None:
        return PRESET_POSITIONS[cfg.model.preset], f"the {cfg.model.preset} preset"
    config = Path(cfg.model.path).expanduser() / "config.json"
    try:
        positions = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None, f"{config} is not readable here"
    return (positions, str(config)) if isinstance(positions, int) and not isinstance(positions, bool) else (None, "")


def micro_batch_tokens(cfg: TrialConfig) -> int:
    """Padded tokens of the learner's largest micro-batch: the token budget, or rows x (prompt + response)."""
    lr = cfg.learner
    longest = PROMPT_TOKENS[cfg.task.name] + cfg.rollout.max_new_tokens
    if lr.max_tokens_per_micro_batch:
        return max(lr.max_tokens_per_micro_batch, longest)  # a row over the budget is a micro-batch alone
    return min(lr.micro_batch_size, cfg.sequences_per_minibatch) * longest


def memory_report(cfg: TrialConfig) -> str:
    """The pre-flight's lines: per learner rank and per rollout engine, and a verdict with its fix."""
    shape, source = model_shape(cfg)
    if shape is None:
        return f"memory pre-flight: no estimate ({source})"
    lr, ro = cfg.learner, cfg.rollout
    bf16 = cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and lr.use_gpu)
    tokens = micro_batch_tokens(cfg)
    where = (f"GPU of {lr.gpu_memory_gb:g} GB ({lr.gpu_memory_gb * GB / GIB:.1f} GiB)" if lr.use_gpu
             else "rank (CPU memory here)")

    def estimate(checkpointing: bool):
        return learner_memory(shape, dtype_bytes=2 if bf16 else 4, zero_stage=lr.zero_stage, world=lr.num_workers,
                              tokens=tokens, gradient_checkpointing=checkpointing, chunk_tokens=lr.logits_chunk_tokens,
                              reserve_gb=2.0 if lr.use_gpu else 0.0)

    mem = estimate(lr.gradient_checkpointing)
    size = f"{shape.params / 1e9:.2f} B" if shape.params >= 1e8 else f"{shape.params / 1e6:.2f} M"
    lines = [f"memory pre-flight ({size} parameters, from {source}; micro-batch of {tokens} tokens, prompts "
             f"taken as {PROMPT_TOKENS[cfg.task.name]}):",
             f"  learner {where}: {mem.total / GIB:.1f} GiB = weights {mem.weights / GIB:.1f} + gradients "
             f"{mem.gradients / GIB:.1f} + optimizer {mem.optimizer / GIB:.1f} (ZeRO-{lr.zero_stage} over "
             f"{lr.num_workers}) + activations {mem.activations / GIB:.1f} (checkpointing "
             f"{'on' if lr.gradient_checkpointing else 'off'}) + logits chunk {mem.logits / GIB:.2f} + reserve "
             f"{mem.reserve / GIB:.1f}"]
    if lr.use_gpu and mem.total > lr.gpu_memory_gb * GB:
        lines.append("  learner: WILL NOT FIT. " + learner_fix(cfg, mem, estimate(True)))
    elif lr.use_gpu:
        lines.append(f"  learner: fits ({mem.total / GIB:.1f} of {lr.gpu_memory_gb * GB / GIB:.1f} GiB)")
    if ro.backend == "vllm" and ro.num_gpus:
        lines += engine_lines(cfg, shape, bf16)
    return "\n".join(lines)


def learner_fix(cfg: TrialConfig, mem, checkpointed) -> str:
    """The knob that brings a rank under its GPU's memory, in the order a researcher would reach for them."""
    lr, gpu = cfg.learner, cfg.learner.gpu_memory_gb * GB
    if not lr.gradient_checkpointing and checkpointed.total <= gpu:
        return f"learner.gradient_checkpointing: true brings it to {checkpointed.total / GIB:.1f} GiB"
    states = mem.weights + mem.gradients + mem.optimizer
    if lr.zero_stage < 3 and states > gpu / 2:
        return (f"weights, gradients and optimizer states alone take {states / GIB:.1f} GiB: learner.zero_stage: 3 "
                f"or more learner.num_workers shard them")
    budget = max(1, int(micro_batch_tokens(cfg) * (gpu - (mem.total - mem.activations)) / max(mem.activations, 1)))
    return (f"activations of {mem.activations / GIB:.1f} GiB: learner.max_tokens_per_micro_batch <= {budget} (or a "
            f"smaller learner.micro_batch_size){'' if lr.gradient_checkpointing else ', with gradient_checkpointing'}")


def engine_lines(cfg: TrialConfig, shape: ModelShape, bf16: bool) -> list[str]:
    lr, ro = cfg.learner, cfg.rollout
    sequences = cfg.sequences_per_rank * -(-lr.num_workers // ro.num_engines)
    eng = engine_memory(shape, dtype_bytes=2 if bf16 else 4, tensor_parallel=ro.tensor_parallel_size,
                        gpu_gb=lr.gpu_memory_gb, utilization=ro.gpu_memory_utilization,
                        max_len=PROMPT_TOKENS[cfg.task.name] + ro.max_new_tokens, sequences=sequences)
    head = (f"  rollout engine, per GPU of {ro.tensor_parallel_size}: {eng.budget / GIB:.1f} GiB "
            f"(gpu_memory_utilization {ro.gpu_memory_utilization:g}) = weights {eng.weights / GIB:.1f} + KV cache "
            f"{eng.kv_room / GIB:.1f} ({eng.kv_per_sequence / 2**20:.0f} MiB a sequence at full length)")
    if eng.concurrent < 1:
        return [head, "  rollout engine: WILL NOT FIT one sequence at full length: raise gpu_memory_utilization or "
                      "rollout.tensor_parallel_size"]
    share = min(eng.concurrent, eng.sequences)
    return [head, f"  rollout engine: fits; {share} of its {eng.sequences} sequences at full length at once"
                  + ("" if share == eng.sequences else " (vLLM queues the rest: more tensor parallel or engines "
                                                       "for speed)")]
