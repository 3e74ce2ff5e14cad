"""A sweep's rollout sets, kept across its configurations: a set (the rollout engines of one Ray Train run
and its verifier) starts once and serves one run after another, so a later configuration or look pays no
engine or verifier start.

    sweep driver ── RolloutPool (an actor on the head node, num_cpus 0; it owns every set's actors)
       run A: acquire("A") -> set 0 (started) ... release("A") -> set 0 idle
       run B: acquire("B") -> set 0 (kept: B pushes its base policy's weights before generating)

A run's ranks push their weights before their first generation (`Trial.begin`), and every weight version
carries its run's tag (trainables/rollout/client.py), so a set never serves one run's weights to another. A
set's engines restart in place when their process dies, as a run's own do. Engines colocated with a run's
learner GPUs, or fed by vLLM's weight transfer engine, stay a run's own (`poolable`). A pruned configuration's set
is released by the driver (its run dies without its `finally`); `holds(run)` is then false, which tells
any rank of it still alive that its sweep stopped it. Sets of another model or engine shape are stopped
before a new one starts, so idle sets never hold what a run needs. `train` runs without a pool.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOL_NAME = "rollout-pool"
ROOM_WAIT_S = 5.0  # a new set's wait for room, between looks for a released one
# The rollout fields an engine is built from; sampling (EAD's schedule, group size) is per request.
ENGINE_FIELDS = (
    "backend",
    "num_engines",
    "num_cpus",
    "num_gpus",
    "resources",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "colocate",
    "weight_transfer",
)


def poolable(cfg) -> bool:
    """Whether a run's engines may serve the runs after it: not when they share the run's learner GPUs
    (`colocate`) or carry vLLM's weight transfer engine (nccl, ipc): both are set up for one run's ranks."""
    from trainables.rollout.push import WEIGHT_PUSHES

    return not cfg.colocate and not WEIGHT_PUSHES[cfg.weight_transfer].engine_transfer


def set_key(cfg, model_path: str | Path) -> str:
    """What makes two runs' engines interchangeable: the same policy folder and engine fields."""
    fields = {name: getattr(cfg, name) for name in ENGINE_FIELDS}
    return json.dumps({"model": str(model_path), **fields}, sort_keys=True, default=str)


@dataclass
class RolloutSet:
    key: str
    group: str  # the name its engines' placement group is under (`engine_group_name`)
    engines: list
    verifier: Any


class RolloutPool:
    """The sets, idle or held by a run (by its Ray Train run name). A threaded actor: a run waiting for its
    engines' placement does not hold up another's release."""

    def __init__(self):
        self.idle: list[RolloutSet] = []
        self.held: dict[str, RolloutSet] = {}
        self.started = 0  # sets started: the bench and the tests read how often a set was kept instead
        self.groups = 0  # placement groups asked for (each a name of its own)
        self.lock = threading.Lock()

    def acquire(self, run: str, cfg, model_path: str) -> tuple[list, Any]:
        """`run`'s engines and verifier: an idle set of the same key, or a new one. While the cluster has no room
        for a new set, a set released meanwhile (a pruned run's, whose release can come just after the next run
        asked) is taken instead."""
        from trainables.rollout.service import PLACEMENT_TIMEOUT_S, NoRoomError

        key, deadline = set_key(cfg, model_path), time.monotonic() + PLACEMENT_TIMEOUT_S
        while True:
            with self.lock:
                if run in self.held:  # the same run asking again (its driver thread retried)
                    return self.held[run].engines, self.held[run].verifier
                kept = next((s for s in self.idle if s.key == key), None)
                others = [s for s in self.idle if s.key != key]
                self.idle = [s for s in self.idle if s.key == key and s is not kept]
            for other in others:  # another model or engine shape: its resources go to this run
                stop_set(other)
            try:
                kept = kept or self.start(key, cfg, model_path, max(0.1, min(ROOM_WAIT_S, deadline - time.monotonic())))
            except NoRoomError:
                if time.monotonic() >= deadline:
                    raise
                continue
            with self.lock:
                self.held[run] = kept
            return kept.engines, kept.verifier

    def start(self, key: str, cfg, model_path: str, timeout_s: float) -> RolloutSet:
        from trainables.rollout.service import start_rollout_engines
        from trainables.verifier import start_verifier

        with self.lock:
            group = f"pool-{self.groups}"
            self.groups += 1
        engines = start_rollout_engines(cfg, model_path, group, timeout_s=timeout_s)
        with self.lock:
            self.started += 1
        return RolloutSet(key, group, engines, start_verifier())

    def release(self, run: str) -> None:
        """`run` is over (finished, failed or pruned): its set serves the next run."""
        with self.lock:
            kept = self.held.pop(run, None)
            if kept is not None:
                self.idle.append(kept)

    def holds(self, run: str) -> bool:
        with self.lock:
            return run in self.held

    def sets_started(self) -> int:
        return self.started

    def close(self) -> None:
        """Stop every set, idle or held: the experiment is over."""
        with self.lock:
            sets, self.idle, self.held = [*self.idle, *self.held.values()], [], {}
        for kept in sets:
            stop_set(kept)


def stop_set(kept: RolloutSet) -> None:
    import ray

    from trainables.rollout.service import remove_engine_group

    for actor in (*kept.engines, kept.verifier):
        ray.kill(actor)
    remove_engine_group(kept.group)


def start_pool():
    """The driver's pool, on this (the head) node: it lives as long as the driver's job."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return (
        ray.remote(RolloutPool)
        .options(name=POOL_NAME, get_if_exists=True, num_cpus=0, max_concurrency=16, scheduling_strategy=here)
        .remote()
    )


@contextmanager
def rollout_set(cfg, model_path: str | Path, run: str):
    """(engines, verifier, the pool that lent them) for Ray Train run `run`: borrowed from the driver's pool
    and given back after the run, or without a pool (`train`) started for the run and stopped after it."""
    import ray

    from trainables.rollout.service import remove_engine_group, start_rollout_engines
    from trainables.verifier import start_verifier

    pool = find_pool() if poolable(cfg) else None
    if pool is not None:
        engines, verifier = ray.get(pool.acquire.remote(run, cfg, str(model_path)))
    else:
        engines, verifier = start_rollout_engines(cfg, model_path, run), start_verifier()
    try:
        yield engines, verifier, pool
    finally:
        if pool is not None:
            ray.get(pool.release.remote(run))
        else:
            for actor in (*engines, verifier):
                ray.kill(actor)
            remove_engine_group(run)


def close_pool(pool) -> None:
    """Stop the pool's sets and the pool: its placement groups would outlive it in a longer-lived job."""
    import ray

    try:
        ray.get(pool.close.remote(), timeout=60)
        ray.kill(pool)
    except Exception as e:  # noqa: BLE001 - Ray gone already: its job took them
        print(f"rollout pool not closed ({type(e).__name__}: {e})")


def release_runs(runs) -> None:
    """The driver's side of a pruned configuration: its runs' sets back to the pool (without one, their
    engines' placement groups removed, which stops their engines)."""
    from trainables.rollout.service import remove_engine_group

    pool = find_pool()
    for run in runs:
        if pool is not None:
            pool.release.remote(run)
        else:
            remove_engine_group(run)


def find_pool():
    """The driver's pool when it runs one (a sweep or a study), else None (`train`: a run's own engines)."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(POOL_NAME)
    except ValueError:
        return None
