"""The algorithm presets a spec chooses with `algorithm.name`: one registry, read by the config's
choices, the trial loop and the docs alike.

    grpo                online group only
    luffy               a fixed slot of each group holds a teacher trajectory, in LUFFY's own recipe: no
                        std division, no clip, a constant normaliser (sum / max response length)
    oger                the k lowest-divergence online members are replaced by teacher trajectories,
                        and correct online members get R_OGER = D exp(-H) R_m (OGER eq. 7-8)
    oger_no_refinement  the same, R_OGER = D R_m (the paper's "w/o refinement")
    oger_no_reward      the replacement only (the paper's "w/o reward")

A preset's `defaults` are `algorithm.*` values it starts from; a spec that sets a field keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class AlgorithmPreset:
    replacement: Literal["none", "fixed", "lowest_divergence"]  # which online slots teachers take
    exploration_reward: bool  # add R_OGER to correct online members
    refine: bool = True  # multiply R_OGER by exp(-H) of the last token
    defaults: dict[str, Any] = field(default_factory=dict)  # algorithm.* fields the preset sets unless the spec does

    @property
    def uses_offline(self) -> bool:
        return self.replacement != "none"

    @property
    def needs_embeddings(self) -> bool:
        return self.replacement == "lowest_divergence" or self.exploration_reward


ALGORITHMS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset("none", exploration_reward=False),
    # LUFFY's reference script: grpo_use_std=False, loss_remove_clip=True, sum / 8192 (its max response length).
    "luffy": AlgorithmPreset(
        "fixed",
        exploration_reward=False,
        defaults={"use_std": False, "clip_low": None, "clip_high": None, "loss_agg": "seq-mean-token-sum-norm"},
    ),
    "oger": AlgorithmPreset("lowest_divergence", exploration_reward=True, refine=True),
    "oger_no_refinement": AlgorithmPreset("lowest_divergence", exploration_reward=True, refine=False),
    "oger_no_reward": AlgorithmPreset("lowest_divergence", exploration_reward=False),
}
