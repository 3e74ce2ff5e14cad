"""The DeepSpeed learner on a real Ray Train worker group: alignment and data-parallel equivalence."""

from __future__ import annotations

import pytest
import torch

from trainables.config import TrialConfig
from trainables.data.arithmetic import make_splits
from trainables.data.tasks import encode_prompt
from trainables.learner import build_train_batch, last_token_index
from trainables.rollout.hf import HFEngine
from trainables.rollout.types import RolloutBatch, SamplingSpec

PROMPTS, GROUP = 4, 4


def small_config(num_workers: int) -> TrialConfig:
    return TrialConfig.model_validate({
        "rollout": {"group_size": GROUP, "max_new_tokens": 24},
        "learner": {"num_workers": num_workers, "prompts_per_step": PROMPTS, "micro_batch_size": 4, "lr": 1e-3},
    })


@pytest.fixture(scope="module")
def rollouts(tiny_model_path) -> RolloutBatch:
    engine = HFEngine(tiny_model_path)
    train, _ = make_splits(0, [1], train_size=PROMPTS, val_size=1)
    prompts = [encode_prompt(engine.tokenizer, p) for p in train]
    return engine.generate(prompts, GROUP, SamplingSpec("fixed", {"temperature": 1.0}, 24, seed=5))


def test_behaviour_logprobs_match_the_learner_at_temperature_one(rollouts, tiny_model_path):
    """At T = 1 the sampler's log-probs equal a recomputation: the token columns line up."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = build_train_batch(rollouts, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logp = logits.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    diff = (logp - batch.behaviour_logp).abs()[batch.response_mask]
    assert diff.max() < 1e-4
    last = last_token_index(batch.response_mask)
    lengths = torch.tensor([len(r) for r in rollouts.response_ids])
    assert torch.equal(batch.response_mask.sum(1), lengths)
    assert all(batch.response_mask[i, last[i]] and not batch.response_mask[i, last[i] + 1 :].any()
               for i in range(batch.size))


def one_update(config: dict) -> None:
    """Ray Train worker: one optimizer step on this rank's shard of a fixed global batch."""
    import ray.train

    from trainables.learner import Learner, build_train_batch
    from trainables.rollout.types import RolloutBatch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    cfg = TrialConfig.model_validate(config["trial"])
    full: RolloutBatch = config["rollouts"]
    per_rank = PROMPTS // world
    p0, p1 = rank * per_rank, (rank + 1) * per_rank
    shard = RolloutBatch(full.prompt_ids[p0:p1], full.response_ids[p0 * GROUP : p1 * GROUP],
                         full.behaviour_logprobs[p0 * GROUP : p1 * GROUP], full.texts[p0 * GROUP : p1 * GROUP],
                         full.finish_reasons[p0 * GROUP : p1 * GROUP], n=GROUP)
    learner = Learner(config["model_path"], cfg, world_size=world)
    batch = build_train_batch(shard, pad_id=0)
    logp_old, _ = learner.old_logprobs(batch)
    advantages = config["advantages"][p0 * GROUP : p1 * GROUP]
    learner.update(batch, advantages, logp_old, torch.ones_like(logp_old))
    state = learner.full_state_dict()
    if rank == 0:
        torch.save(state, config["out"])


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_weights(ray_cluster, rollouts, tiny_model_path, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    advantages = torch.randn(PROMPTS * GROUP, generator=torch.Generator().manual_seed(0))
    weights = {}
    for world in (1, 2):
        out = tmp_path / f"w{world}.pt"
        TorchTrainer(
            one_update,
            train_loop_config={"trial": small_config(world).model_dump(mode="json"), "rollouts": rollouts,
                               "model_path": str(tiny_model_path), "advantages": advantages, "out": str(out)},
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=world, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name=f"dp{world}", storage_path=str(tmp_path / "ray")),
        ).fit()
        weights[world] = torch.load(out)
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    moved = max((weights[1][k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-4  # the update did something
    for key in before:
        torch.testing.assert_close(weights[2][key], weights[1][key], atol=1e-6, rtol=1e-5, msg=key)
