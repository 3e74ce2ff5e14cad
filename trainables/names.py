"""The variants of each registry by name, with what the spec asks of them: all the spec, its checks and
the command lines need, without importing the variants themselves (torch, Ray, transformers), so a
command refuses bad input at once. Each registry imports its names from here and asserts that its
keys are these (`same_names`): one list per kind.
"""

from __future__ import annotations

from dataclasses import dataclass

# trainables.algo.losses
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
TIS_LEVELS = ("token", "sequence")

# trainables.rollout.service: rollout engines; trainables.rollout.push: weight transfers
ENGINES = ("hf", "vllm")
WEIGHT_PUSHES = ("object_store", "gloo", "nccl", "ipc")
# Bucket-sized buffers each transfer's sender holds besides the weights, and where: on the learner's
# device (nccl: vLLM's double buffer; ipc: none, the engines map the tensors) or in host memory.
PUSH_BUFFERS = {"object_store": (1, "host"), "gloo": (1, "host"), "nccl": (2, "device"), "ipc": (0, "device")}

# trainables.data.models: model presets
TINY_PRESET = "tiny"  # the embedded default, built from its spec section
SMOLLM2_PRESET = "smollm2-135m-instruct"
MODEL_PRESETS = (TINY_PRESET, SMOLLM2_PRESET)
TINY_MAX_POSITIONS = 512  # the tiny preset's context: prompt and response tokens together

# trainables.rewards.verify: a rollout's verdict
REASONS = ("correct", "wrong", "no_think", "no_boxed", "parse_error", "timeout")


@dataclass(frozen=True)
class ScheduleSpec:
    """What the config asks of a temperature schedule (trainables.rollout.ead.SCHEDULES)."""

    params_field: str  # the decoding section's field holding its keyword arguments: a section, or the one number
    logprob_temperature: str | float  # the learner's temperature by default: "rollout" (tau_t) or 1.0


SCHEDULES = {
    # EAD: the learner at T = 1, truncated importance sampling correcting the annealed sampler.
    "ead": ScheduleSpec(params_field="ead", logprob_temperature=1.0),
    # A fixed T: on-policy when the learner divides its logits by the same T.
    "fixed": ScheduleSpec(params_field="temperature", logprob_temperature="rollout"),
}


def same_names(registry, names, kind: str) -> None:
    """A registry's keys must be its kind's names here, in the same order."""
    if tuple(registry) != tuple(names):
        raise AssertionError(f"{kind}: the registry has {tuple(registry)}, trainables/names.py {tuple(names)}")
