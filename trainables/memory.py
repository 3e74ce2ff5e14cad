"""A memory pre-flight: the peak GPU memory of one learner rank and of one rollout engine, estimated from
the model's shape and the spec, before anything starts (`--dry-run`).

Learner rank (bytes; P parameters, b bytes per weight in the learner's dtype, W ranks, ZeRO stage z), the
terms as DeepSpeed's ZeRO (runtime/zero/stage_1_and_2.py, stage3.py, at its default buckets) holds them:

    weights      P b                 / W under ZeRO-3
    gradients    P b                 / W under ZeRO-2, 3 (partitions kept in the weights' dtype)
    optimizer    P (8 + 4 [bf16])    / W under ZeRO-1, 2, 3   (Adam's m and v in fp32, fp32 master weights)
                 + P 4 [bf16, no ZeRO]                         (the bf16 optimizer's fp32 gradients)
    activations  per token, per layer: b (6 H + 2 K + 4 I) kept for backward (H hidden, K the key/value
                 width, I the MLP width); with gradient checkpointing only the layer input, b H, per
                 layer, then one layer's activations recomputed at a time
    logits       one chunk of C positions: C V c, c = 32 bytes with the entropy in the graph (an entropy
                 bonus), 16 with it as a value, 12 without (measured, tests/test_memory.py), and two
                 gradients of the V x H embedding matrix (a chunk's head gradient, the embedding's)
    step         the optimizer step's temporaries: under ZeRO 8 bytes per element of what it steps at
                 once (the gradient cast to fp32 and AdamW's denominator), the rank's partition, or a
                 ZeRO-3 sub-group of at most 1e9 elements; without ZeRO ~3 x 4 bytes x the largest tensor
    push         the weight push (`weight_push_memory`): a bucket at a time, what it gathers and packs
    reserve      on a GPU the CUDA context and NCCL communicators (1.5 GiB), and ZeRO's buffers: the
                 gradient reduce bucket (5e8 elements) and under ZeRO-3 the live gathered parameters (1e9)

The peak is the states plus the largest of three moments that come one after another (backward, the
optimizer step, the weight push), plus the reserve.

Rollout engine (vLLM preallocates `gpu_memory_utilization` of its GPUs): weights P b / tp, then the KV
cache, 2 L K b per token / tp, for its sequences at full length.

The activation constant counts the tensors a Qwen2/Llama decoder layer saves for backward (the norms'
outputs, q, k and v, the attention output and projection, the MLP's gate, up, activation and product);
attention itself is taken as memory-efficient (FlashAttention / SDPA: no T x T scores).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
GB = 10**9
# What nvidia-smi reports for the memory sizes cards are sold by: H100 80GB (an A100 80GB reports 81,920),
# H200 141GB, A100 40GB. Another size is taken as GB of 10^9 bytes, less than any card of that size has.
CARD_MIB = {80: 81_559, 141: 143_771, 40: 40_960}
CONTEXT_GIB = 1.5  # a GPU rank's CUDA context, NCCL communicators and allocator slack
# DeepSpeed's ZeRO defaults (runtime/zero/config.py), which the learner's config leaves as they are.
REDUCE_BUCKET = 5 * 10**8  # gradient elements reduced at once (stages 1-3)
MAX_LIVE_PARAMETERS = 10**9  # ZeRO-3: gathered parameters alive at once
SUB_GROUP = 10**9  # ZeRO-3: elements the optimizer steps at once
CHUNK_BYTES = {"grad": 32, "value": 16, "none": 12}  # per position x vocabulary entry, by the entropy's mode
ENGINE_ACTIVATION_FRACTION = 0.05  # of the engine's share left for vLLM's own activations and graphs


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a decoder-only transformer's config.json (Qwen2 / Llama family)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # input and output embeddings share one matrix
    attention_bias: bool = True  # biases on q, k, v (Qwen2); Llama has none
    head_dim: int | None = None  # None: hidden / heads

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        return cls(
            config["hidden_size"],
            config["num_hidden_layers"],
            config["intermediate_size"],
            config["num_attention_heads"],
            config.get("num_key_value_heads", config["num_attention_heads"]),
            config["vocab_size"],
            bool(config.get("tie_word_embeddings", False)),
            attention_bias=config.get("attention_bias", config.get("model_type") == "qwen2"),
            head_dim=config.get("head_dim"),
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @property
    def params(self) -> int:
        """Embeddings (twice when untied), and per layer attention (q, o: H x heads d; k, v: H x K, with
        biases on q, k, v where the model has them), the gated MLP (3 H I) and two norms; the final norm."""
        q_width = self.heads * (self.head_dim or self.hidden // self.heads)
        attention = 2 * self.hidden * q_width + 2 * self.hidden * self.kv_width
        attention += (q_width + 2 * self.kv_width) if self.attention_bias else 0
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * layer + self.hidden


# The paper specs' models, for a pre-flight where their folders are not mounted (their config.json).
KNOWN_SHAPES = {
    "Qwen2.5-Math-1.5B": ModelShape(1536, 28, 8960, 12, 2, 151936, tied=True),
    "Qwen2.5-Math-7B": ModelShape(3584, 28, 18944, 28, 4, 152064, tied=False),
}


def card_bytes(gpu_gb: float) -> tuple[float, str]:
    """(bytes, how they were taken) of a card sold as `gpu_gb` GB."""
    if gpu_gb in CARD_MIB:
        return CARD_MIB[gpu_gb] * 2**20, f"{CARD_MIB[gpu_gb] * 2**20 / GIB:.1f} GiB as the card reports"
    return gpu_gb * GB, f"{gpu_gb * GB / GIB:.1f} GiB, taken as 10^9 bytes a GB"


@dataclass(frozen=True)
class LearnerMemory:
    weights: float
    gradients: float
    optimizer: float
    activations: float  # what the backward pass holds at its peak besides the states (logits chunk included)
    logits: float  # of which the logits chunk and the embedding's gradients
    step: float  # the optimizer step's temporaries (after backward, when the activations are gone)
    push: float  # the weight push's (after the step)
    reserve: float  # context and ZeRO's buffers
    buckets: float  # of which ZeRO's buffers

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def phases(self) -> dict[str, float]:
        return {"backward": self.activations, "optimizer step": self.step, "weight push": self.push}

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def total(self) -> float:
        return self.states + self.phases[self.peak_phase] + self.reserve


def learner_memory(
    shape: ModelShape,
    *,
    dtype_bytes: int,
    zero_stage: int,
    world: int,
    tokens: int,
    gradient_checkpointing: bool,
    chunk_tokens: int,
    entropy: str = "value",
    push: float = 0.0,
    gpu: bool = True,
) -> LearnerMemory:
    """Peak bytes of one learner rank at its largest micro-batch of `tokens` (rows x longest row), in the
    steady state (the optimizer's states exist from the first step on). `entropy`: how the learner's
    pass computes it (`trainables.algo.logprobs.ENTROPY_MODES`); `push`: `weight_push_memory`'s bytes; `gpu`:
    a GPU rank has a CUDA context, and its caching allocator holds ZeRO's reduce bucket whole (a CPU
    rank's pages exist only as far as the bucket is used, the model's gradients at most).

    Backward's peak has every saved activation alive and a logits chunk recomputed (without
    checkpointing they add up; with it only the layer inputs are saved, and a layer's recomputed
    activations come after the logits).
    """
    p, b = shape.params, dtype_bytes

    def shard(nbytes: float, from_stage: int) -> float:
        return nbytes / world if zero_stage >= from_stage else nbytes

    master = 4 if b < 4 else 0  # a bf16 learner keeps fp32 master weights
    per_layer = tokens * b * (6 * shape.hidden + 2 * shape.kv_width + 4 * shape.intermediate)
    logits = min(chunk_tokens, tokens) * shape.vocab * CHUNK_BYTES[entropy] + 2 * shape.vocab * shape.hidden * b
    if gradient_checkpointing:
        activations = tokens * shape.layers * b * shape.hidden + max(logits, 2 * per_layer)
    else:
        activations = shape.layers * per_layer + logits
    optimizer = shard(p * (8 + master), 1) + (p * master if zero_stage == 0 else 0)
    if zero_stage == 0:
        step = 3 * 4 * shape.vocab * shape.hidden
    else:
        step = 8 * (min(SUB_GROUP, p / world) if zero_stage == 3 else p / world)
    reduced = REDUCE_BUCKET if gpu else min(REDUCE_BUCKET, p)
    buckets = (reduced * b if zero_stage >= 1 else 0) + (min(MAX_LIVE_PARAMETERS, p) * b if zero_stage == 3 else 0)
    return LearnerMemory(
        weights=shard(p * b, 3),
        gradients=shard(p * b, 2),
        optimizer=optimizer,
        activations=activations,
        logits=logits,
        step=step,
        push=push,
        reserve=(CONTEXT_GIB * GIB if gpu else 0) + buckets,
        buckets=buckets,
    )


def weight_push_memory(
    shape: ModelShape, *, dtype_bytes: int, zero_stage: int, bucket_bytes: int, buffers: int
) -> float:
    """What a weight push holds on a learner rank beyond its states (`trainables.rollout.push`): it goes a
    bucket at a time, so under ZeRO-3 one gathered bucket, and `buffers` bucket-sized buffers of the
    transfer in the rank's own memory (its packing or copy). A tensor larger than a bucket is a bucket."""
    full = shape.params * dtype_bytes  # a bucket holds at most the model, at least its largest tensor (the embedding)
    bucket = max(min(bucket_bytes, full), shape.vocab * shape.hidden * dtype_bytes)
    return bucket * ((1 if zero_stage == 3 else 0) + buffers)


@dataclass(frozen=True)
class EngineMemory:
    budget: float  # gpu_memory_utilization x the engine's GPUs
    weights: float
    kv_per_sequence: float  # one sequence at full length
    sequences: int  # the engine's batch (prompts x group size of the ranks it serves)

    @property
    def kv_room(self) -> float:
        return self.budget * (1 - ENGINE_ACTIVATION_FRACTION) - self.weights

    @property
    def concurrent(self) -> int:
        """Sequences at full length whose KV cache fits at once (vLLM queues the rest)."""
        return max(0, int(self.kv_room // self.kv_per_sequence))


def engine_memory(
    shape: ModelShape,
    *,
    dtype_bytes: int,
    tensor_parallel: int,
    gpu_gb: float,
    utilization: float,
    max_len: int,
    sequences: int,
) -> EngineMemory:
    """One vLLM engine over `tensor_parallel` GPUs of `gpu_gb` each."""
    kv = 2 * shape.layers * shape.kv_width * dtype_bytes * max_len / tensor_parallel
    return EngineMemory(
        budget=utilization * card_bytes(gpu_gb)[0],
        weights=shape.params * dtype_bytes / tensor_parallel,
        kv_per_sequence=kv,
        sequences=sequences,
    )
