"""A short trial with `rollout.backend: vllm`: the rollout service holds a real vLLM engine, the
learner ranks train on its rollouts and broadcast their weights back every step (gloo, in buckets;
the GPU smoke script's trial sends them through the object store); a push in many buckets leaves the
engine as one whole state dict does."""

from __future__ import annotations

import pytest
from ray.util.state import list_actors

from orchestrator import train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri

STEPS = 3


@pytest.mark.slow
def test_trial_trains_on_vllm_rollouts(ray_cluster, tiny_model_path, tmp_path):
    # Sampling at T = 1 with a large learning rate: the learner's T = 1 recomputation of each sampled
    # token equals vLLM's log-prob, so every TIS weight is 1, only while vLLM holds the weights the
    # learner pushed after its last update (lr 1e-3 moves them far enough that stale ones would show;
    # a bucket lost or misplaced in the broadcast would too).
    cfg = load_trial_spec(
        "search_spaces/ead.yaml",
        [
            f"storage={tmp_path}",
            "rollout.backend=vllm",
            f"learner.steps={STEPS}",
            "learner.lr=1e-3",
            "rollout.decoding.schedule=fixed",
            "rollout.decoding.temperature=1.0",
            "validation.every=3",
            "validation.num_prompts=16",
            "validation.samples=2",
            "rollout.weight_transfer=gloo",
            "rollout.weight_bucket_mb=1",
        ],
    )
    final = train.run(cfg)
    assert final["progress/step"] == STEPS and final["rollout/response_length"] > 0
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
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


@pytest.mark.slow
def test_a_push_in_buckets_leaves_the_weights_one_state_dict_does(ray_cluster, tiny_model_path):
    """The same perturbed weights pushed to a vLLM service in 1 MiB buckets (through the object store and
    over gloo) and as one bucket: the engine samples the same tokens with the same log-probs each time,
    and other tokens than before the push."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from trainables.config import RolloutConfig
    from trainables.rollout.push import GlooPush, ObjectStorePush
    from trainables.rollout.service import start_rollout_service
    from trainables.rollout.types import SamplingSpec

    cfg = RolloutConfig(backend="vllm", weight_transfer="gloo")
    service = start_rollout_service(cfg, tiny_model_path)
    spec = SamplingSpec("fixed", {"temperature": 1.0}, max_new_tokens=16, seed=3)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]

    def sample(version):
        batch = ray.get(service.generate.remote(prompts, 4, spec, version))
        return batch.response_ids, batch.behaviour_logprobs

    before = sample(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    gen = torch.Generator().manual_seed(0)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # one tensor, as in the model
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    pushes = [ObjectStorePush([service], 2**20), GlooPush([service], 2**20), ObjectStorePush([service], 2**30)]
    samples = []
    for version, push in enumerate(pushes, start=1):
        push(state, version)
        samples.append(sample(version))
    assert samples[0] != before
    assert samples[0] == samples[1] == samples[2]
    ray.kill(service)
