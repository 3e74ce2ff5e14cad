"""The base policy's validation, computed once per machine and reused.

Before its first update every trial validates the base policy (val/*_base). That result depends only
on the model's files, the validation, task and prompt sections, the seed, the number of ranks, the
engine's settings and the software, never on the RL settings a sweep varies: so every configuration
of a sweep (and both arms of a confirmation) at the same seed would compute the same numbers again.
The first trial writes them to `<cache_dir>/validations/<key>.json`; a trial that asks at the same
time waits for it under a file lock. A cache file that does not parse as {name: number} is ignored
and computed again (it is data, not code).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from filelock import FileLock, Timeout

from trainables.config import TrialConfig
from trainables.runtime.ranks import from_rank0

CACHE_VERSION = 2  # bump when validation's arithmetic or problems change (2: prompts past the context skipped)
# Sections and fields that cannot change what the base policy's validation returns.
UNUSED = {
    "name": None,
    "storage": None,
    "cache_dir": None,
    "algorithm": None,
    "encoder": None,
    "checkpoint": None,
    "logging": None,
    "rollout": {"decoding", "tis_cap", "tis_level", "group_size", "weight_transfer", "weight_bucket_mb"},
    "learner": {
        "steps",
        "prompts_per_step",
        "minibatches",
        "micro_batch_size",
        "lr",
        "weight_decay",
        "warmup_steps",
        "grad_clip",
        "gradient_checkpointing",
        "max_tokens_per_micro_batch",
        "logits_chunk_tokens",
        "gpu_memory_gb",
        "cpus_per_worker",
        "resources",
    },
}


def base_key(cfg: TrialConfig, model_path: str | Path, world: int) -> str:
    """What decides the base validation, hashed: the spec less `UNUSED` (and less `offline` on the
    built-in task), the size and modification time of the model's files and of every file the spec
    names, the ranks, and the versions and CPU capability of the software."""
    spec = cfg.model_dump(mode="json")
    for section, fields in ({**UNUSED, "offline": None} if cfg.task.name == "arithmetic" else UNUSED).items():
        if fields is None:
            spec.pop(section, None)
        else:
            spec[section] = {k: v for k, v in spec[section].items() if k not in fields}
    model = [p for p in Path(model_path).iterdir() if p.is_file()]
    data = [Path(v) for v in strings(spec) if os.path.isfile(v)]  # benchmark and prompt files, by their stats
    identity = {
        "spec": spec,
        "files": sorted(file_stat(p) for p in model + data),
        "world": world,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "version": CACHE_VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def strings(tree) -> list[str]:
    if isinstance(tree, dict):
        return [s for v in tree.values() for s in strings(v)]
    if isinstance(tree, list):
        return [s for v in tree for s in strings(v)]
    return [tree] if isinstance(tree, str) else []


def file_stat(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def read(path: Path) -> dict[str, float] | None:
    """The cached metrics, or None where the file is missing or not {str: finite number}."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(data, dict)
        and data
        and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for k, v in data.items()
        )
    )
    return {k: float(v) for k, v in data.items()} if ok else None


def write(path: Path, metrics: dict[str, float]) -> None:
    staging = path.with_name(f"{path.name}.{os.getpid()}.partial")
    staging.write_text(json.dumps(metrics, sort_keys=True))
    os.replace(staging, path)  # atomic: a reader sees the whole file or none


def cached_base(
    validate: Callable[[int], dict[str, float]], cfg: TrialConfig, model_path: str | Path, *, rank: int, world: int
) -> tuple[dict[str, float], bool]:
    """(the base policy's val/*, whether it came from the cache), the same on every rank. `validate` is
    the trial's `Validation` (a collective: every rank calls it or none does)."""
    folder = Path(cfg.cache_dir).expanduser() / "validations"
    path = folder / f"{base_key(cfg, model_path, world)}.json"
    lock = None
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock")
        try:  # another trial computing the same numbers: wait for them, then read them
            lock.acquire(timeout=cfg.checkpoint.actor_timeout_s)
        except Timeout:
            lock = None
    try:
        hit = from_rank0(read(path) if rank == 0 else None)
        if hit is not None:
            return hit, True
        metrics = validate(0)
        if rank == 0:
            write(path, metrics)
        return metrics, False
    finally:
        if lock is not None:
            lock.release()
