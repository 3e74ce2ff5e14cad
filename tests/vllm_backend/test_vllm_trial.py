"""A short trial with `rollout.backend: vllm`: the rollout service holds a real vLLM engine, the
learner ranks train on its rollouts and broadcast their weights back every step (gloo, in buckets;
the GPU smoke script's trial sends them through the object store)."""

from __future__ import annotations

import pytest
from ray.util.state import list_actors

from orchestrator import train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker

STEPS = 3


@pytest.mark.slow
def test_trial_trains_on_vllm_rollouts(ray_cluster, tiny_model_path, tmp_path):
    # Sampling at T = 1 with a large learning rate: the learner's T = 1 recomputation of each sampled
    # token equals vLLM's log-prob, so every TIS weight is 1, only while vLLM holds the weights the
    # learner pushed after its last update (lr 1e-3 moves them far enough that stale ones would show;
    # a bucket lost or misplaced in the broadcast would too).
    cfg = load_trial_spec("search_spaces/ead.yaml", [
        f"storage={tmp_path}", "rollout.backend=vllm", f"learner.steps={STEPS}", "learner.lr=1e-3",
        "rollout.decoding.schedule=fixed", "rollout.decoding.temperature=1.0", "validation.every=3",
        "validation.num_prompts=16", "validation.samples=2", "rollout.weight_transfer=gloo", "rollout.weight_bucket_mb=1"])
    final = train.run(cfg)
    assert final["progress/step"] == STEPS and final["rollout/response_length"] > 0
    tracker = Tracker(train.default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    weights = tracker.metric_history(run.info.run_id, "tis/weight_mean")
    assert [step for step, _ in weights] == [1, 2, 3]
    assert all(abs(mean - 1) < 0.01 for _, mean in weights), weights
    assert max(v for _, v in tracker.metric_history(run.info.run_id, "tis/weight_max")) < 1.05
    assert "val/arithmetic/avg_at_2" in run.data.metrics
    (service,) = [a for a in list_actors(filters=[("class_name", "=", "RolloutService")], detail=True)]
    assert service.state == "DEAD"  # the trial's service is gone with the trial


@pytest.mark.slow
def test_gpu_smoke_script_runs_on_cpu(ray_cluster, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", "infra/gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.main(["--cpu"]) == 0
    out = capsys.readouterr().out
    assert "gpu smoke on CPU: 2 steps" in out
    for label, _ in smoke.ROWS:
        value = float(out.split(label)[1].split()[0])
        assert value > 0, label
