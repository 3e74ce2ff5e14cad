"""A trial's checkpoints through Ray Train: every rank writes and seals its part, and a resume restores
the latest intact one, falling back to older ones (layout and trust: trainables/runtime/checkpoint.py)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import ray
import torch

from trainables.runtime.checkpoint import (
    TRIAL_STATE,
    TrialState,
    first_intact,
    load_engine,
    rank_file,
    read_rank_state,
    read_record,
    saved_world_size,
    write_manifest,
)
from trainables.runtime.errors import CheckpointError, UnusableCheckpoint, write_failure
from trainables.runtime.seal import seal_key


class Part(NamedTuple):
    """One seed's share of a checkpoint: its folder inside it ("" for a run of one seed), its learner,
    rank 0's record of it (TRIAL_STATE) and this rank's own plain data (its RNG streams, and its next
    batch when generated ahead)."""

    folder: str
    learner: object
    trial_state: dict
    rank_state: dict


def save(
    parts: list[Part],
    step: int,
    rank: int,
    world: int,
    metrics: dict[str, float],
    before_report: Callable[[], None] = lambda: None,
) -> float:
    """Save every seed's part after RL step `step` (0-based) and report `metrics` with them. Ray Train
    uploads the merged folder and commits it once every rank's upload is done. Returns the seconds it took."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        try:
            for part in parts:
                where = Path(folder) / part.folder
                where.mkdir(exist_ok=True)
                part.learner.save(where, client_state={"step": step})
                torch.save({"step": step, **part.rank_state}, where / rank_file(rank))
                if rank == 0:
                    (where / TRIAL_STATE).write_text(json.dumps({"step": step, **part.trial_state}))
            write_manifest(folder, rank, world)
        except (OSError, RuntimeError) as e:
            if (failure := write_failure(e, folder, step)) is None:
                raise
            raise failure from e
        before_report()
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
    return time.perf_counter() - start


def restore(
    parts: list[tuple[str, object]], rank: int, world: int, trial: str, trust: bool = False
) -> list[dict] | None:
    """For each seed's (folder in the checkpoint, learner): the trial state (TRIAL_STATE) of the latest
    intact checkpoint, with this rank's RNG streams (`rng`) and `next_rollouts` (None when none was saved),
    its learner loaded; None when there is no checkpoint to resume from. `trust`: one the product did not
    seal is taken too (--trust-unsealed)."""
    latest = ray.train.get_checkpoint()
    if latest is None:
        return None

    def same_world(path: str, folder: Path) -> int:
        saved = saved_world_size(folder)
        if saved not in (None, world):
            raise CheckpointError(
                f"checkpoint: {path} was saved by {saved} learner ranks; resume with "
                f"learner.num_workers={saved} (this run has {world})"
            )
        return world

    def load(folder: Path) -> list[dict]:
        states = []
        for part, learner in parts:
            state = read_record(folder / part / TRIAL_STATE, TrialState).model_dump()  # ValueError: unusable
            rank_state = read_rank_state(folder / part, rank)  # before the engine: a refused file loads nothing
            load_engine(learner.load, folder / part)
            states.append({**state, "rng": rank_state["rng"], "next_rollouts": rank_state.get("next_rollouts")})
        return states

    problems: list[str] = []

    def unusable(path: str, problem: str) -> None:
        problems.append(f"{path}: {problem}")
        if rank == 0:
            print(f"[trial {trial}] checkpoint {path} is unusable: {problem}; trying the one before it", flush=True)

    found = first_intact(
        ((c.path, c.as_directory()) for c in newest_first(latest)),
        same_world,
        load,
        unusable,
        None if trust else seal_key(),
    )
    if found is None:
        raise UnusableCheckpoint(f"checkpoint: no intact checkpoint to resume {trial} from; the latest, {problems[0]}")
    path, states = found
    if rank == 0:
        print(f"[trial {trial}] resumed after step {states[0]['step'] + 1} from {path}", flush=True)
    return states


def newest_first(latest):
    """The latest checkpoint, then the older committed ones, newest first (fetched only if needed)."""
    yield latest
    older = [c for c in ray.train.get_all_reported_checkpoints() if c.checkpoint.path != latest.path]
    for reported in sorted(older, key=lambda c: c.metrics.get("progress/step", 0), reverse=True):
        yield reported.checkpoint
