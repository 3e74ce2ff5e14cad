"""VLLMEngine on a real vLLM engine (CPU build on CPUs) against a transformers recomputation.

One LLM for the module (its load dominates the time). The EAD parameters are chosen so that tau
changes at every token past the warm-up: an off-by-one position in the processor, or a log-prob
taken before the schedule, shows as a mismatch with the recomputation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainables.data.arithmetic import make_splits
from trainables.data.prompts import chat_messages
from trainables.rollout.ead import SCHEDULES
from trainables.rollout.hf import top_p_filter
from trainables.rollout.types import SamplingSpec
from trainables.rollout.vllm_engine import PARAMS_KEY, SCHEDULE_KEY, STEP_KEY, VLLMEngine

# tau_t = 2.2 - exp(t / 23) for t >= 2 at step 4 (d_s = 3 + 5 * 4): from 1.11 at t = 2 down to the
# floor 0.1 at t ~ 17, a different value at every token.
EAD = {"tau_max": 1.2, "tau_min": 0.1, "d0": 3.0, "warmup_tokens": 2, "time_scale": 1.0}
EAD_STEP = 4
TOL = 2e-3  # |log p| difference allowed between vLLM (fp32) and transformers (fp32)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return VLLMEngine(tiny_model_path, dtype=torch.float32, enforce_eager=True, max_model_len=512)


@pytest.fixture(scope="module")
def hf_model(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(engine):
    train, _ = make_splits(0, [1], 6, 0)
    out = []
    for problem in train:
        ids = engine.tokenizer.apply_chat_template(chat_messages(problem), add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@torch.no_grad()
def recompute(model, prompt: list[int], response: list[int], spec: SamplingSpec, shift: int = 0) -> torch.Tensor:
    """log p of each response token under the HF model's logits / tau_(t + shift), then top_p. [T]"""
    ids = torch.tensor([prompt + response])
    logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)].float()  # [T, V]
    positions = (torch.arange(len(response)) + shift).clamp(min=0)
    tau = SCHEDULES[spec.schedule](positions, spec.step, **spec.params)  # [T]
    logp = top_p_filter(logits / tau[:, None], spec.top_p).log_softmax(-1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def max_error(model, batch, spec, shift=0) -> float:
    errors = [
        (recompute(model, batch.prompt_of(i), r, spec, shift) - torch.tensor(lp)).abs().max().item()
        for i, (r, lp) in enumerate(zip(batch.response_ids, batch.behaviour_logprobs))
    ]
    return max(errors)


def test_processor_follows_each_request_position():
    """The processor's temperature for a row is the schedule at that request's own token count."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from trainables.rollout.vllm_engine import ScheduledTemperatureProcessor

    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=64))  # the one field it reads
    proc = ScheduledTemperatureProcessor(config, torch.device("cpu"), False)
    ead = SamplingParams(extra_args={SCHEDULE_KEY: "ead", PARAMS_KEY: EAD, STEP_KEY: EAD_STEP})
    fixed = SamplingParams(extra_args={SCHEDULE_KEY: "fixed", PARAMS_KEY: {"temperature": 0.5}})
    out_a, out_b, out_c = [], [7, 7, 7, 7, 7], []
    proc.update_state(
        BatchUpdate(
            3,
            removed=[],
            added=[(0, ead, [1], out_a), (1, ead, [1], out_b), (2, SamplingParams(), [1], out_c)],
            moved=[],
        )
    )

    def applied_tau() -> torch.Tensor:
        return 1.0 / proc.apply(torch.ones(3, 4))[:, 0]

    def ead_tau(t: int) -> float:
        return SCHEDULES["ead"](torch.tensor([t]), EAD_STEP, **EAD).item()

    for _ in range(4):  # the model runner appends one token per step to the referenced lists
        assert applied_tau().tolist() == pytest.approx([ead_tau(len(out_a)), ead_tau(len(out_b)), 1.0])
        out_a.append(3)
        out_b.append(3)
    # Row 2 now holds a fixed-temperature request; then rows 0 and 1 swap.
    proc.update_state(BatchUpdate(3, removed=[2], added=[(2, fixed, [1], [])], moved=[]))
    proc.update_state(BatchUpdate(3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert applied_tau().tolist() == pytest.approx([ead_tau(len(out_b)), ead_tau(len(out_a)), 0.5])
    proc.update_state(BatchUpdate(2, removed=[0], added=[], moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert proc.rows.keys() == {0, 1} and applied_tau()[0].item() == pytest.approx(0.5)


@pytest.mark.parametrize(
    "schedule, params, step, top_p",
    [
        ("ead", EAD, EAD_STEP, 1.0),
        ("fixed", {"temperature": 0.7}, 0, 0.9),
    ],
)
def test_logprobs_are_the_scheduled_distribution(engine, hf_model, prompts, schedule, params, step, top_p):
    spec = SamplingSpec(schedule=schedule, params=params, max_new_tokens=24, top_p=top_p, step=step, seed=3)
    batch = engine.generate(prompts[:3], 2, spec)
    assert max_error(hf_model, batch, spec) < TOL
    if schedule == "ead":  # tau at the neighbouring position is clearly wrong: the check can see it
        assert max_error(hf_model, batch, spec, shift=1) > 10 * TOL
        assert max_error(hf_model, batch, spec, shift=-1) > 10 * TOL


def test_rollout_batch_contract(engine, prompts):
    spec = SamplingSpec(schedule="fixed", params={"temperature": 1.0}, max_new_tokens=64, seed=11)
    batch = engine.generate(prompts, 4, spec)
    eos = engine.tokenizer.eos_token_id
    rows = len(prompts) * 4
    assert batch.n == 4 and batch.prompt_ids == prompts
    assert len(batch.response_ids) == len(batch.behaviour_logprobs) == len(batch.texts) == rows
    assert len(batch.finish_reasons) == rows and batch.weight_version == engine.weight_version
    for ids, logp, text, reason in zip(batch.response_ids, batch.behaviour_logprobs, batch.texts, batch.finish_reasons):
        assert len(logp) == len(ids) > 0 and all(v <= 0.0 for v in logp)
        assert eos not in ids[:-1]  # nothing after an EOS
        if reason == "stop":
            assert ids[-1] == eos  # the EOS is kept: it is learned
        else:
            assert reason == "length" and len(ids) == spec.max_new_tokens and ids[-1] != eos
        assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
        assert engine.tokenizer.eos_token not in text
    assert "stop" in batch.finish_reasons  # the SFT'd tiny model ends most answers
    # One spec, one result; another seed, another result.
    assert engine.generate(prompts, 4, spec).response_ids == batch.response_ids
    other = SamplingSpec(schedule="fixed", params={"temperature": 1.0}, max_new_tokens=64, seed=12)
    assert engine.generate(prompts, 4, other).response_ids != batch.response_ids


def test_update_weights_changes_outputs(engine, hf_model, prompts):
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    # A prompt longer than a KV block, so its prefix is cached before the update.
    long_prompt = (prompts[0] * (block // len(prompts[0]) + 2))[: block + 8]
    batch_prompts = [long_prompt, prompts[1]]
    spec = SamplingSpec(schedule="ead", params=EAD, max_new_tokens=16, step=EAD_STEP, seed=5)
    before = engine.generate(batch_prompts, 2, spec)

    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.5 * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=gen) if v.ndim > 1 else v
        for k, v in original.items()
    }
    if "lm_head.weight" in perturbed and hf_model.config.tie_word_embeddings:  # one tensor, as in the model
        perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    assert engine.update_weights(perturbed, 7) == 7 and engine.weight_version == 7
    after = engine.generate(batch_prompts, 2, spec)
    assert after.weight_version == 7 and after.response_ids != before.response_ids
    hf_model.load_state_dict(perturbed)
    try:  # every weight arrived, and no stale prefix KV was reused
        assert max_error(hf_model, after, spec) < TOL
    finally:
        hf_model.load_state_dict(original)

    with pytest.raises(ValueError, match="does not match"):
        engine.update_weights({**original, "model.extra.weight": torch.zeros(1)}, 8)
    assert engine.weight_version == 7

    assert engine.update_weights(original, 9) == 9  # back to the original weights: same samples
    again = engine.generate(batch_prompts, 2, spec)
    assert again.response_ids == before.response_ids
    flat = [v for row in again.behaviour_logprobs for v in row]
    assert flat == pytest.approx([v for row in before.behaviour_logprobs for v in row], abs=1e-4)
