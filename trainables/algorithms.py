"""The algorithm presets a spec chooses with `algorithm.name`: one registry, read by the config's
choices, the trial loop and the docs alike.

    grpo                online group only
    luffy               a fixed slot of each group holds a teacher trajectory (LUFFY)
    oger                the k lowest-divergence online members are replaced by teacher trajectories,
                        and correct online members get R_OGER = D exp(-H) R_m (OGER eq. 7-8)
    oger_no_refinement  the same, R_OGER = D R_m (the paper's "w/o refinement")
    oger_no_reward      the replacement only (the paper's "w/o reward")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AlgorithmPreset:
    replacement: Literal["none", "fixed", "lowest_divergence"]  # which online slots teachers take
    exploration_reward: bool  # add R_OGER to correct online members
    refine: bool = True  # multiply R_OGER by exp(-H) of the last token

    @property
    def uses_offline(self) -> bool:
        return self.replacement != "none"

    @property
    def needs_embeddings(self) -> bool:
        return self.replacement == "lowest_divergence" or self.exploration_reward


ALGORITHMS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset("none", exploration_reward=False),
    "luffy": AlgorithmPreset("fixed", exploration_reward=False),
    "oger": AlgorithmPreset("lowest_divergence", exploration_reward=True, refine=True),
    "oger_no_refinement": AlgorithmPreset("lowest_divergence", exploration_reward=True, refine=False),
    "oger_no_reward": AlgorithmPreset("lowest_divergence", exploration_reward=False),
}
