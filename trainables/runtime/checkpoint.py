"""What a trial checkpoint holds beyond the DeepSpeed engine, and how a resume trusts one.

Layout of one checkpoint folder (the per-rank folders merged by Ray Train):

    engine/...                 DeepSpeed: model, optimizer and scheduler states of every rank
    rank_<r>.pt                rank r's RL step and its python / numpy / torch RNG states
    trial_state.json           rank 0: step, validation history, base-policy validation, metrics (`TrialState`)
    MANIFEST.rank_<r>.json     written last by rank r: size and sha256 of each file it wrote (`Manifest`)

A checkpoint is complete when every rank's manifest is there and every listed file matches it; a
missing manifest is a save that never finished, a mismatch is corruption. Each manifest carries the
product's seal (trainables/runtime/seal.py) over its content: a checkpoint the product did not write
is refused unless the user trusts it (--trust-unsealed). A checkpoint may come
from someone else: every file it names stays inside its folder, and every torch.load in a trial reads
tensors and plain data only (TORCH_FORCE_WEIGHTS_ONLY_LOAD, with DeepSpeed's own three record
classes allowed), never arbitrary pickled objects. The data position, the
sampling seeds and the offline-replacement RNG are pure functions of the RL step, so the step
restores them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import random
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError

from trainables.runtime.seal import seal_key, seal_of

TRIAL_STATE = "trial_state.json"
T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)


class Record(BaseModel):
    """A JSON file a checkpoint holds: read as data, its shape checked (unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class FileEntry(Record):
    size: NonNegativeInt
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(Record):
    rank: NonNegativeInt
    world_size: PositiveInt
    files: dict[str, FileEntry]
    seal: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # `manifest_seal`: the product wrote it


class TrialState(Record):
    step: NonNegativeInt  # the RL step (0-based) the checkpoint was saved after
    base_val: dict[str, float]
    val_history: list[tuple[NonNegativeInt, dict[str, float]]]
    metrics: dict[str, float]
    model_path: str  # the base policy the trial started from
    trial: dict


def read_record(path: Path, kind: type[R]) -> R:
    """`kind` read from the JSON file at `path`; ValueError in one line naming the file and the first
    problem (unreadable, not JSON, a wrong type, a missing or unknown key)."""
    try:
        return kind.model_validate_json(path.read_bytes())
    except OSError as e:
        raise ValueError(f"{path.name} is unreadable ({e.strerror or e})") from None
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"])) or "the file"
        raise ValueError(f"{path.name}: {where}: {first['msg']}") from None


def allow_deepspeed_records() -> None:
    """The classes DeepSpeed pickles into its checkpoints (ZeRO 1-3 on CPU and GPU), allowed to load
    under weights_only; nothing else is."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])


def read_rank_state(folder: str | Path, rank: int) -> dict:
    """Rank `rank`'s step and RNG states; ValueError when the file holds anything but tensors and plain data."""
    path = Path(folder) / rank_file(rank)
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path.name} holds objects other than tensors and plain data, refused unread ({str(e).splitlines()[0]})"
        ) from None


def foreign_file(folder: str | Path) -> str:
    """The first file under `folder` (relative path) that holds objects other than tensors, plain data and
    DeepSpeed's own records, or "a file" when every one reads: what a refused load names."""
    allow_deepspeed_records()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".pt", ".pth", ".bin")):
        try:
            torch.load(path, weights_only=True, map_location="cpu")
        except (pickle.UnpicklingError, RuntimeError, EOFError):
            return str(path.relative_to(folder))
    return "a file"


def load_engine(load: Callable[[Path], T], folder: str | Path) -> T:
    """`load(folder)` of a checkpoint's DeepSpeed files; a file holding pickled objects is refused unread
    with a ValueError in one line that names it (torch's weights-only guard raised inside DeepSpeed)."""
    try:
        return load(Path(folder))
    except pickle.UnpicklingError:
        raise ValueError(
            f"{foreign_file(folder)} holds objects other than tensors and plain data, refused unread"
        ) from None


def rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def manifest_file(rank: int) -> str:
    return f"MANIFEST.rank_{rank}.json"


def rng_state() -> dict:
    """The RNG states as plain data and tensors, so a resume reads them with torch.load(weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_seal(rank: int, world_size: int, files: dict[str, dict], key: bytes) -> str:
    """The seal of a manifest (trainables/runtime/seal.py) over its canonical JSON: with the sha256 of
    every file it lists, it vouches for the whole of rank `rank`'s part."""
    body = json.dumps({"rank": rank, "world_size": world_size, "files": files}, sort_keys=True, separators=(",", ":"))
    return seal_of(body.encode(), key)


def write_manifest(folder: str | Path, rank: int, world_size: int, key: bytes | None = None) -> None:
    """Seal rank `rank`'s part of a checkpoint: every file now in `folder`, with size and sha256, and the
    manifest's seal under `key` (default: this user's or team's, `seal_key`)."""
    folder = Path(folder)
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith("MANIFEST.")
    }
    seal = manifest_seal(rank, world_size, files, seal_key() if key is None else key)
    manifest = {"rank": rank, "world_size": world_size, "files": files, "seal": seal}
    (folder / manifest_file(rank)).write_text(json.dumps(manifest, indent=1))


def saved_world_size(folder: str | Path) -> int | None:
    """How many learner ranks saved the checkpoint (None when rank 0's manifest is unreadable)."""
    try:
        return read_record(Path(folder) / manifest_file(0), Manifest).world_size
    except ValueError:
        return None


def checkpoint_problem(folder: str | Path, world_size: int, key: bytes | None) -> str | None:
    """Why the checkpoint in `folder` cannot be restored, or None when it is complete, intact and sealed
    under `key` (None: the user trusts it unsealed)."""
    folder = Path(folder)
    for rank in range(world_size):
        manifest = folder / manifest_file(rank)
        if not manifest.is_file():
            return f"{manifest.name} is missing (rank {rank} never finished saving)"
        try:
            record = read_record(manifest, Manifest)
        except ValueError as e:
            return str(e)
        if key is not None and (problem := seal_problem(manifest.name, record, key)):
            return problem
        for name, expected in record.files.items():
            path = folder / name
            if not path.resolve().is_relative_to(folder.resolve()):
                return f"{manifest.name} names {name}, outside the checkpoint's folder"
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != expected.size:
                return f"{name} has {path.stat().st_size} bytes, its manifest says {expected.size}"
            if _sha256(path) != expected.sha256:
                return f"{name} does not match its sha256"
    return None


def seal_problem(name: str, manifest: Manifest, key: bytes) -> str | None:
    """Why the manifest `name` is not vouched for by this product's seal under `key`, or None."""
    files = {k: v.model_dump() for k, v in manifest.files.items()}
    if manifest.seal is None:
        why = "has no seal of this product's key (written elsewhere, or before seals)"
    elif not hmac.compare_digest(manifest.seal, manifest_seal(manifest.rank, manifest.world_size, files, key)):
        why = "does not match its seal (changed since it was sealed, or sealed with another key)"
    else:
        return None
    return f"{name} {why}; if you trust the checkpoint, add --trust-unsealed"


def first_intact(
    candidates: Iterable[tuple[str, AbstractContextManager]],
    world: Callable[[str, Path], int],
    load: Callable[[Path], T],
    unusable: Callable[[str, str], None],
    key: bytes | None,
) -> tuple[str, T] | None:
    """(name, `load` of its folder) of the first intact checkpoint among `candidates` (name, a context
    giving its folder), newest first: a folder whose files fail `checkpoint_problem` for
    `world(name, folder)` ranks and `key`, or that `load` refuses (ValueError), is reported to
    `unusable(name, why)` and the next one is tried. None when none is intact."""
    for name, opened in candidates:
        with opened as folder:
            folder = Path(folder)
            problem = checkpoint_problem(folder, world(name, folder), key)
            if problem is None:
                try:
                    return name, load(folder)
                except ValueError as e:  # a rank file holding pickled objects: not read
                    problem = str(e)
        unusable(name, problem)
    return None
