"""Build once, across processes: a folder made under a file lock, then reused while it exists."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target` (a model folder), made by `build(staging folder)` unless it exists; processes that ask
    at once wait for the one that builds."""
    target = target.expanduser().resolve()
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another process built it while we waited
            return target
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        start = time.perf_counter()
        build(staging)
        staging.rename(target)  # atomic: a half-built folder is never taken for a model
        print(f"built {target} in {time.perf_counter() - start:.0f} s", flush=True)
    return target
