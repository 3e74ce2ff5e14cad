"""The memory pre-flight of `--dry-run`: will a spec's learner ranks and rollout engines fit their GPUs?

Reads the model's shape from its config.json (the paper specs' Qwen2.5-Math shapes are known when their
folders are not mounted here) and prints the estimate of `trainables.memory` against
`learner.gpu_memory_gb`, with the knob that fixes a spec that does not fit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainables.config import TrialConfig
from trainables.memory import (
    ENGINE_ACTIVATION_FRACTION,
    GIB,
    KNOWN_SHAPES,
    EngineMemory,
    ModelShape,
    card_bytes,
    engine_memory,
    learner_memory,
    weight_push_memory,
)
from trainables.names import PUSH_BUFFERS, SMOLLM2_PRESET, TINY_MAX_POSITIONS, TINY_PRESET

PROMPT_TOKENS = {"offline_prompts": 1024, "arithmetic": 128}  # a longest row's prompt allowance, by task
# (LUFFY's max_prompt_length for real data; the built-in task's prompts are a few dozen tokens)
PRESET_SHAPES = {  # the built-in presets' shapes (the tiny one comes from its spec section)
    SMOLLM2_PRESET: ModelShape(576, 30, 1536, 9, 3, 49152, tied=True, attention_bias=False),
}


MAX_RANKS = 256  # the most learner ranks a fix suggests
PRESET_POSITIONS = {TINY_PRESET: TINY_MAX_POSITIONS, SMOLLM2_PRESET: 8192}


def model_shape(cfg: TrialConfig) -> tuple[ModelShape | None, str]:
    """(shape, where it came from), or (None, why not)."""
    if cfg.model.path is None:
        if cfg.model.preset == TINY_PRESET:
            t = cfg.model.tiny
            return ModelShape(
                t.hidden_size, t.num_layers, t.intermediate_size, t.num_heads, t.num_kv_heads, t.vocab_size, tied=True
            ), "the tiny preset"
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
    """The pre-flight's lines: per learner rank and per rollout engine (and their sum on a shared GPU),
    each with a verdict and the settings that fix it."""
    shape, source = model_shape(cfg)
    if shape is None:
        return f"memory pre-flight: no estimate ({source})"
    lr, ro = cfg.learner, cfg.rollout
    bf16 = cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and lr.use_gpu)
    card, taken = card_bytes(lr.gpu_memory_gb)
    estimate = learner_estimate(cfg, shape, 2 if bf16 else 4)
    mem = estimate()
    size = f"{shape.params / 1e9:.2f} B" if shape.params >= 1e8 else f"{shape.params / 1e6:.2f} M"
    where = f"GPU of {lr.gpu_memory_gb:g} GB ({taken})" if lr.use_gpu else "rank (CPU memory here)"
    lines = [
        f"memory pre-flight ({size} parameters, from {source}; micro-batch of {micro_batch_tokens(cfg)} tokens, "
        f"prompts taken as {PROMPT_TOKENS[cfg.task.name]}):",
        f"  learner {where}: {learner_parts(mem, cfg)}",
    ]
    if lr.use_gpu and mem.total > card:
        lines.append("  learner: WILL NOT FIT. " + learner_fixes(cfg, estimate, card))
    elif lr.use_gpu:
        lines.append(f"  learner: fits ({mem.total / GIB:.1f} of {card / GIB:.1f} GiB)")
    if ro.backend == "vllm" and ro.num_gpus:
        eng = engine_estimate(cfg, shape, bf16)
        lines += engine_lines(cfg, eng)
        if ro.colocate:
            lines += colocated_lines(mem, eng, card)
    return "\n".join(lines)


def learner_estimate(cfg: TrialConfig, shape: ModelShape, dtype_bytes: int):
    """learner_memory at the spec's settings, or at others: estimate(checkpointing=, zero_stage=, world=, tokens=,
    chunk=)."""
    lr, ro = cfg.learner, cfg.rollout

    def estimate(
        checkpointing: bool = lr.gradient_checkpointing,
        zero_stage: int = lr.zero_stage,
        world: int = lr.num_workers,
        tokens: int | None = None,
        chunk: int | None = lr.logits_chunk_tokens,
    ):
        tokens = tokens or micro_batch_tokens(cfg)
        buffers, where = PUSH_BUFFERS[ro.weight_transfer]  # a CPU rank's host memory is its own
        push = weight_push_memory(
            shape,
            dtype_bytes=dtype_bytes,
            zero_stage=zero_stage,
            bucket_bytes=ro.weight_bucket_mb * 2**20,
            buffers=buffers if where == "device" or not lr.use_gpu else 0,
        )
        return learner_memory(
            shape,
            dtype_bytes=dtype_bytes,
            zero_stage=zero_stage,
            world=world,
            tokens=tokens,
            gradient_checkpointing=checkpointing,
            chunk_tokens=chunk or tokens,
            entropy="grad" if cfg.algorithm.entropy_coef else "value",
            push=push,
            gpu=lr.use_gpu,
        )

    return estimate


def learner_parts(mem, cfg: TrialConfig) -> str:
    """The total as the sum of its parts: the states, the phase that peaks, the reserve; the other phases."""
    lr = cfg.learner
    phase = mem.peak_phase
    shown = {
        "backward": f"backward {mem.activations / GIB:.2f} (layer activations "
        f"{(mem.activations - mem.logits) / GIB:.2f} with checkpointing "
        f"{'on' if lr.gradient_checkpointing else 'off'}, logits chunk {mem.logits / GIB:.2f})"
    }
    others = ", ".join(f"{name} {value / GIB:.2f}" for name, value in mem.phases.items() if name != phase)
    return (
        f"{mem.total / GIB:.2f} GiB = weights {mem.weights / GIB:.2f} + gradients {mem.gradients / GIB:.2f} + "
        f"optimizer {mem.optimizer / GIB:.2f} (ZeRO-{lr.zero_stage} over {lr.num_workers}) + "
        f"{shown.get(phase, f'{phase} {mem.phases[phase] / GIB:.2f}')} + reserve {mem.reserve / GIB:.2f} "
        f"(ZeRO buffers {mem.buckets / GIB:.2f}); in place of {phase}: {others}"
    )


def learner_fixes(cfg: TrialConfig, estimate, card: float) -> str:
    """The settings that bring a rank under its card, each as far as it reaches: the free ones
    (checkpointing, smaller logits chunks) alone where they do, else more ranks, ZeRO-3 and a smaller token
    budget, in the order of what they cost (GPUs, communication, steps' speed)."""
    lr = cfg.learner

    def fitting(**settings):
        mem = estimate(**settings)
        return mem if mem.total <= card else None

    if not lr.gradient_checkpointing and (mem := fitting(checkpointing=True)):
        return f"learner.gradient_checkpointing: true brings it to {mem.total / GIB:.1f} GiB"
    chunks = [c for c in (2048, 1024, 512, 256) if c < (lr.logits_chunk_tokens or micro_batch_tokens(cfg))]
    if chunk := next((c for c in chunks if fitting(checkpointing=True, chunk=c)), None):
        total = estimate(checkpointing=True, chunk=chunk).total
        return f"learner.logits_chunk_tokens: {chunk} brings it to {total / GIB:.1f} GiB"
    fixes = []
    if lr.zero_stage >= 1:  # sharded states shrink with every rank added (ranks that take whole prompt groups)
        world = next(
            (
                w
                for w in range(lr.num_workers + 1, MAX_RANKS + 1)
                if lr.prompts_per_step % w == 0 and fitting(checkpointing=True, world=w)
            ),
            0,
        )
        if world:
            total = estimate(checkpointing=True, world=world).total
            fixes.append(f"learner.num_workers: {world} ({total / GIB:.1f} GiB)")
    if lr.zero_stage < 3 and (mem := fitting(checkpointing=True, zero_stage=3)):
        fixes.append(f"learner.zero_stage: 3 ({mem.total / GIB:.1f} GiB)")
    longest, tokens = PROMPT_TOKENS[cfg.task.name] + cfg.rollout.max_new_tokens, micro_batch_tokens(cfg)
    if tokens > longest and fitting(checkpointing=True, tokens=longest):  # a row over the budget is alone
        low, high = longest, tokens  # the largest budget that fits: fitting(low), not fitting(high)
        while high - low > 1:
            low, high = (
                ((low + high) // 2, high)
                if fitting(checkpointing=True, tokens=(low + high) // 2)
                else (low, (low + high) // 2)
            )
        fixes.append(f"learner.max_tokens_per_micro_batch: {low} or less")
    if fixes:
        return "any of: " + "; ".join(fixes)
    mem = estimate(checkpointing=True)
    return (
        f"no setting of this spec fits one row of {longest} tokens: the states alone take "
        f"{mem.states / GIB:.1f} GiB; ZeRO-3 with its optimizer offloaded to CPU (DeepSpeed's offload_optimizer), "
        f"or a larger card"
    )


def engine_estimate(cfg: TrialConfig, shape: ModelShape, bf16: bool) -> EngineMemory:
    lr, ro = cfg.learner, cfg.rollout
    return engine_memory(
        shape,
        dtype_bytes=2 if bf16 else 4,
        tensor_parallel=ro.tensor_parallel_size,
        gpu_gb=lr.gpu_memory_gb,
        utilization=ro.gpu_memory_utilization,
        max_len=PROMPT_TOKENS[cfg.task.name] + ro.max_new_tokens,
        sequences=cfg.sequences_per_rank * -(-lr.num_workers // ro.num_engines),
    )


def colocated_lines(mem, eng: EngineMemory, card: float) -> list[str]:
    """A learner rank and an engine on one GPU: while the engine generates, the learner keeps its states and
    reserve (the client empties PyTorch's cache before the engine wakes); during the push the engine holds
    its weights. The larger of the two moments must fit the card."""
    generating = mem.states + mem.reserve + eng.budget
    pushing = mem.states + mem.reserve + mem.push + eng.weights
    line = (
        f"  colocated on one GPU: {max(generating, pushing) / GIB:.1f} GiB = learner states and reserve "
        f"{(mem.states + mem.reserve) / GIB:.1f} + the larger of the engine's generation {eng.budget / GIB:.1f} "
        f"and the push with the engine's weights {(mem.push + eng.weights) / GIB:.1f}"
    )
    if max(generating, pushing) <= card:
        return [line, f"  colocated: fits ({max(generating, pushing) / GIB:.1f} of {card / GIB:.1f} GiB)"]
    room = math.floor(100 * (card - mem.states - mem.reserve) / card) / 100  # rounded down: it must fit
    fix = (
        f"rollout.gpu_memory_utilization <= {room:.2f}"
        if room > 0 and pushing <= card
        else "engines on GPUs of their own (colocate: false), or more learner ranks to shard the states"
    )
    return [line, f"  colocated: WILL NOT FIT. {fix}"]


def engine_lines(cfg: TrialConfig, eng: EngineMemory) -> list[str]:
    ro = cfg.rollout
    head = (
        f"  rollout engine, per GPU of {ro.tensor_parallel_size}: {eng.budget / GIB:.1f} GiB "
        f"(gpu_memory_utilization {ro.gpu_memory_utilization:g}) = weights {eng.weights / GIB:.1f} + KV cache "
        f"{eng.kv_room / GIB:.1f} + vLLM's own {eng.budget * ENGINE_ACTIVATION_FRACTION / GIB:.1f} "
        f"({eng.kv_per_sequence / 2**20:.0f} MiB a sequence at full length)"
    )
    if eng.concurrent < 1:
        return [
            head,
            "  rollout engine: WILL NOT FIT one sequence at full length: raise gpu_memory_utilization or "
            "rollout.tensor_parallel_size",
        ]
    share = min(eng.concurrent, eng.sequences)
    return [
        head,
        f"  rollout engine: fits; {share} of its {eng.sequences} sequences at full length at once"
        + ("" if share == eng.sequences else " (vLLM queues the rest: more tensor parallel or engines for speed)"),
    ]
