"""The learner's token columns line up with the rollout engine's sampled log-probs."""

from __future__ import annotations

import pytest
import torch

from trainables.data.arithmetic import make_splits
from trainables.data.tasks import encode_prompt
from trainables.learner import build_train_batch, last_token_index
from trainables.rollout.hf import HFEngine
from trainables.rollout.types import RolloutBatch, SamplingSpec

PROMPTS, GROUP = 4, 4


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
