"""A memory pre-flight: the peak GPU memory of one learner rank and of one rollout engine, estimated from
the model's shape and the spec, before anything starts (`--dry-run`).

Learner rank (bytes; P parameters, b bytes per weight in the learner's dtype, W ranks, ZeRO stage z):

    weights      P b                 / W under ZeRO-3
    gradients    P b                 / W under ZeRO-2, 3
    optimizer    P (8 + 4 [bf16])    / W under ZeRO-1, 2, 3   (Adam's m and v in fp32, fp32 master weights)
                 + P 4 [bf16]        / W under ZeRO-1, 2, 3   (fp32 gradient partitions of the bf16 optimizer)
    activations  per token, per layer: b (6 H + 2 K + 4 I) kept for backward (H hidden, K the key/value
                 width, I the MLP width); with gradient checkpointing only the layer input, b H, per
                 layer, then one layer's activations recomputed at a time
    logits       one chunk of C positions: C V (b + 12) (the head's output, its fp32 copy, log-softmax
                 and two gradients), and two transient gradients of the V x H embedding matrix
    step         the optimizer step's temporaries, ~3 x 4 bytes x the largest tensor it updates; they
                 come after backward, so the peak is the states plus the larger of the two

Rollout engine (vLLM preallocates `gpu_memory_utilization` of its GPUs): weights P b / tp, then the KV
cache, 2 L K b per token / tp, for its sequences at full length.

The activation constant counts the tensors a Qwen2/Llama decoder layer saves for backward (the norms'
outputs, q, k and v, the attention output and projection, the MLP's gate, up, activation and product);
attention itself is taken as memory-efficient (FlashAttention / SDPA: no T x T scores).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
GB = 10**9  # GPUs are sold in GB: an 80 GB card holds 74.5 GiB
FRAMEWORK_RESERVE_GB = 2.0  # CUDA context, NCCL buffers, allocator fragmentation: a conservative allowance
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
        return cls(config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
                   config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"]),
                   config["vocab_size"], bool(config.get("tie_word_embeddings", False)),
                   attention_bias=config.get("attention_bias", config.get("model_type") == "qwen2"),
                   head_dim=config.get("head_dim"))

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


@dataclass(frozen=True)
class LearnerMemory:
    weights: float
    gradients: float
    optimizer: float
    activations: float  # what the backward pass holds at its peak besides the states (logits chunk included)
    logits: float  # of which the logits chunk
    step: float  # the optimizer step's temporaries (after backward, when the activations are gone)
    reserve: float

    @property
    def total(self) -> float:
        states = self.weights + self.gradients + self.optimizer
        return states + max(self.activations, self.step) + self.reserve


def learner_memory(shape: ModelShape, *, dtype_bytes: int, zero_stage: int, world: int, tokens: int,
                   gradient_checkpointing: bool, chunk_tokens: int, reserve_gb: float = FRAMEWORK_RESERVE_GB,
                   ) -> LearnerMemory:
    """Peak bytes of one learner rank at its largest micro-batch of `tokens` (rows x longest row), in the
    steady state (the optimizer's states exist from the first step on).

    The peak is the larger of two moments: backward's start, with every saved activation alive and a
    logits chunk recomputed (without checkpointing they add up; with it only the layer inputs are
    saved, and a layer's recomputed activations come after the logits), and the optimizer step, whose
    temporaries are about three copies of the largest tensor it updates (the fp32 partition under ZeRO).
    """
    p, b = shape.params, dtype_bytes

    def shard(nbytes: float, from_stage: int) -> float:
        return nbytes / world if zero_stage >= from_stage else nbytes

    master = 4 if b < 4 else 0  # a bf16 learner keeps fp32 master weights and fp32 gradient partitions
    per_layer = tokens * b * (6 * shape.hidden + 2 * shape.kv_width + 4 * shape.intermediate)
    logits = min(chunk_tokens, tokens) * shape.vocab * (b + 12)  # head output, fp32 copy, log-softmax, 2 grads
    logits += 2 * shape.vocab * shape.hidden * b  # a chunk's head-weight gradient before it is accumulated, and
    #                                               the embedding's (dense) gradient
    if gradient_checkpointing:
        activations = tokens * shape.layers * b * shape.hidden + max(logits, 2 * per_layer)
    else:
        activations = shape.layers * per_layer + logits
    largest = p / world if zero_stage >= 1 else shape.vocab * shape.hidden
    return LearnerMemory(
        weights=shard(p * b, 3), gradients=shard(p * b, 2), optimizer=shard(p * (8 + 2 * master), 1),
        activations=activations, logits=logits, step=3 * 4 * largest, reserve=reserve_gb * GIB)


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


def engine_memory(shape: ModelShape, *, dtype_bytes: int, tensor_parallel: int, gpu_gb: float,
                  utilization: float, max_len: int, sequences: int) -> EngineMemory:
    """One vLLM engine over `tensor_parallel` GPUs of `gpu_gb` each."""
    kv = 2 * shape.layers * shape.kv_width * dtype_bytes * max_len / tensor_parallel
    return EngineMemory(budget=utilization * gpu_gb * GB, weights=shape.params * dtype_bytes / tensor_parallel,
                        kv_per_sequence=kv, sequences=sequences)
