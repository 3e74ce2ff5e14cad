"""The base policy's validation cache: keyed by what decides it, ignoring what a sweep varies, and
robust to a cache file that is not its own."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from trainables.config import TrialConfig
from trainables.validation_cache import base_key, cached_base, read


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")
    return folder


def cfg(tmp_path, **fields) -> TrialConfig:
    data = {"cache_dir": str(tmp_path / "cache"), "seed": 0}
    for dotted, value in fields.items():
        *path, leaf = dotted.split("__")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return TrialConfig.model_validate(data)


def test_the_key_ignores_what_a_sweep_varies_and_follows_what_decides_the_validation(tmp_path, model_dir):
    key = base_key(cfg(tmp_path), model_dir, 1)
    for same in (
        {"rollout__decoding__ead__tau_max": 1.5},
        {"algorithm__entropy_coef": 0.01},
        {"learner__lr": 3e-4},
        {"learner__steps": 90},
        {"name": "other"},
        {"storage": "/elsewhere"},
    ):
        assert base_key(cfg(tmp_path, **same), model_dir, 1) == key, same
    for other in (
        {"seed": 1},
        {"validation__num_prompts": 32},
        {"validation__decoding__temperature": 0.7},
        {"rollout__max_new_tokens": 32},
        {"task__val_size": 65},
        {"model__dtype": "bfloat16"},
    ):
        assert base_key(cfg(tmp_path, **other), model_dir, 1) != key, other
    assert base_key(cfg(tmp_path), model_dir, 2) != key  # ranks shard and seed the validation
    os.utime(model_dir / "model.safetensors", ns=(1, 1))  # new weights under the same path
    assert base_key(cfg(tmp_path), model_dir, 1) != key


def test_a_benchmark_file_edited_in_place_is_a_new_key(tmp_path, model_dir):
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"problem": "1+1", "answer": "2"}\n')
    spec = cfg(tmp_path, validation__benchmarks={"math500": str(bench)})
    key = base_key(spec, model_dir, 1)
    bench.write_text('{"problem": "1+2", "answer": "3"}\n')
    os.utime(bench, ns=(10**18, 10**18))
    assert base_key(spec, model_dir, 1) != key


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        "{}",
        '{"val/accuracy": "0.5"}',
        '{"val/accuracy": NaN}',
        '{"val/accuracy": true}',
        '{"val/accuracy": 1e999}',
    ],
)
def test_a_cache_file_that_is_not_metrics_is_ignored(tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    assert read(path) is None


def test_computed_once_then_reused_and_concurrent_askers_wait(tmp_path, model_dir):
    spec, calls = cfg(tmp_path), []

    def validate(step):
        assert step == 0
        calls.append(step)
        time.sleep(0.5)  # a second asker arrives while this one computes
        return {"val/accuracy": 0.25, "val/accuracy_se": 0.02}

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cached_base(validate, spec, model_dir, rank=0, world=1)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(reused for _, reused in results) == [False, True]
    assert all(metrics == {"val/accuracy": 0.25, "val/accuracy_se": 0.02} for metrics, _ in results)
    path = next((tmp_path / "cache" / "validations").glob("*.json"))
    assert json.loads(path.read_text()) == {"val/accuracy": 0.25, "val/accuracy_se": 0.02}
    path.write_text("{broken")  # a damaged file is computed again and replaced
    assert cached_base(validate, spec, model_dir, rank=0, world=1) == (
        {"val/accuracy": 0.25, "val/accuracy_se": 0.02},
        False,
    )
    assert len(calls) == 2
