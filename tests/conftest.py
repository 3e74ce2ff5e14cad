"""Shared fixtures: one local Ray cluster and one embedded tiny model for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO / ".cache"  # the same cache the CLI uses: built once, reused by later runs


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from trainables.config import TinyModelConfig
    from trainables.data.bootstrap import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(), CACHE_DIR)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from orchestrator.train import WORKER_ENV, init_ray

    os.environ.update(WORKER_ENV)
    init_ray(num_cpus=6)
    yield ray
    ray.shutdown()
