"""The rollout service: one Ray actor per trial owning the generation engine, shared by all ranks.

Interface (every backend satisfies it): `generate(prompts, n, spec) -> RolloutBatch`,
`update_weights(state_dict_ref, version) -> version`, `health() -> dict`. Learner ranks call
`generate` with their own shard of prompts; the actor serves the calls one after the other.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray

from trainables.rollout.hf import HFEngine
from trainables.rollout.types import RolloutBatch, SamplingSpec

BACKENDS = {"hf": HFEngine}


class RolloutService:
    def __init__(self, backend: str, model_path: str | Path, num_threads: int = 1):
        import torch

        torch.set_num_threads(max(1, num_threads))  # share the cores with the learner ranks
        start = time.perf_counter()
        self.backend = backend
        self.engine = BACKENDS[backend](model_path)
        self.load_seconds = time.perf_counter() - start

    def generate(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> RolloutBatch:
        return self.engine.generate(prompts, n, spec)

    def update_weights(self, state_dict, version: int) -> int:
        # An ObjectRef nested in the argument list arrives unresolved: one object, one transfer.
        if isinstance(state_dict, list):
            state_dict = ray.get(state_dict[0])
        return self.engine.update_weights(state_dict, version)

    def health(self) -> dict:
        return {
            "backend": self.backend,
            "pid": os.getpid(),
            "weight_version": self.engine.weight_version,
            "load_seconds": self.load_seconds,
        }


def start_rollout_service(backend: str, model_path: str | Path, *, num_cpus: float, name: str | None = None):
    """Create the trial's rollout actor (named, so a restarted learner group finds the same one)."""
    # "DEFAULT": outside the placement group of a Tune trial's driver, which holds only the driver.
    actor = ray.remote(RolloutService).options(
        num_cpus=num_cpus, name=name, get_if_exists=name is not None, max_restarts=0, scheduling_strategy="DEFAULT"
    )
    return actor.remote(backend, str(model_path), max(1, int(num_cpus)))
