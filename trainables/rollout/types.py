"""Plain data objects crossing the rollout service boundary (no framework objects)."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class SamplingSpec:
    """How to decode one request: a per-token temperature schedule and its parameters."""

    schedule: str  # a key of trainables.rollout.ead.SCHEDULES
    params: dict[str, float]
    max_new_tokens: int
    top_p: float = 1.0
    step: int = 0  # RL step (rollout round, 1 at the first rollout), for the step-aware EAD decay
    seed: int = 0


@dataclass
class RolloutBatch:
    """n samples per prompt, flattened prompt-major: sample j of prompt i is row i * n + j."""

    prompt_ids: list[list[int]]  # [P] prompts, unpadded
    response_ids: list[list[int]]  # [P * n] responses, unpadded, EOS included when emitted
    behaviour_logprobs: list[list[float]]  # [P * n] log-prob of each sampled token as sampled
    texts: list[str]  # [P * n] decoded responses, special tokens removed
    finish_reasons: list[str]  # [P * n] "stop" (EOS) or "length" (hit max_new_tokens)
    n: int
    weight_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def decoded(
        cls,
        tokenizer,
        prompts: list[list[int]],
        responses: list[list[int]],
        logprobs: list[list[float]],
        reasons: list[str],
        n: int,
        weight_version: int,
        timings: dict[str, float],
    ) -> RolloutBatch:
        """An engine's batch, its texts decoded without special tokens (as every engine returns them)."""
        return cls(
            [list(p) for p in prompts],
            responses,
            logprobs,
            tokenizer.batch_decode(responses, skip_special_tokens=True),
            reasons,
            n,
            weight_version,
            timings,
        )

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    def prompt_of(self, row: int) -> list[int]:
        return self.prompt_ids[row // self.n]
