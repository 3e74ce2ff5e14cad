"""The papers' recipes as spec defaults: LUFFY's own preset, the learner's log-prob temperature, the teacher
filter, validation samples per benchmark, and EAD's decay by RL step."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from trainables.config import TrialConfig, ValidationConfig
from trainables.evaluation import macro_row
from trainables.rollout.ead import ead_decay, ead_temperature
from trainables.tasks import used_teachers

LUFFY_RECIPE = {"use_std": False, "clip_low": None, "clip_high": None, "loss_agg": "seq-mean-token-sum-norm"}


def test_luffy_preset_is_luffys_recipe():
    """LUFFY's reference run: grpo_use_std=False, loss_remove_clip=True, sum / its response cap."""
    cfg = TrialConfig(algorithm={"name": "luffy"}, rollout={"max_new_tokens": 96})
    assert {key: getattr(cfg.algorithm, key) for key in LUFFY_RECIPE} == LUFFY_RECIPE
    assert cfg.loss_norm_len == 96
    grpo = TrialConfig()
    assert (grpo.algorithm.use_std, grpo.algorithm.clip_low, grpo.algorithm.clip_high, grpo.algorithm.loss_agg) == (
        True,
        0.2,
        0.28,
        "token-mean",
    )  # the other presets keep today's defaults
    assert grpo.loss_norm_len == grpo.rollout.max_new_tokens == 64


def test_a_spec_overrides_a_presets_default():
    cfg = TrialConfig(algorithm={"name": "luffy", "use_std": True, "clip_high": 0.28, "norm_len": 8192})
    assert cfg.algorithm.use_std and cfg.algorithm.clip_high == 0.28 and cfg.algorithm.clip_low is None
    assert cfg.loss_norm_len == 8192
    # The recorded config is explicit: read back, it is the same whatever the presets' defaults become.
    again = TrialConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.algorithm == cfg.algorithm


def test_logprob_temperature_follows_the_schedule():
    """Fixed-T runs are on-policy for the tempered policy (verl); EAD's learner is at T = 1, TIS corrects."""
    fixed = TrialConfig(rollout={"decoding": {"schedule": "fixed", "temperature": 0.6}})
    assert fixed.logprob_temperature == "rollout"
    assert TrialConfig().logprob_temperature == 1.0  # EAD
    assert TrialConfig(algorithm={"logprob_temperature": "rollout"}).logprob_temperature == "rollout"
    assert (
        TrialConfig(
            rollout={"decoding": {"schedule": "fixed"}}, algorithm={"logprob_temperature": 1.0}
        ).logprob_temperature
        == 1.0
    )
    with pytest.raises(ValidationError):
        TrialConfig(algorithm={"logprob_temperature": 0.6})
    with pytest.raises(ValidationError, match="dual_clip"):
        TrialConfig(algorithm={"dual_clip": 1.0})  # c must exceed 1


def test_teacher_filter_keeps_the_named_teachers():
    rows = [
        {"question": "q", "answer": "1", "teacher": t, "solution": "<think>x</think>\\boxed{1}"}
        for t in ("DeepSeek-R1", "Qwen3-32B", "DeepSeek-R1", "GLM-4.5-Air")
    ]
    kept, skipped = used_teachers(rows, ["DeepSeek-R1"], Counter({"overlong": 1}))
    assert [r["teacher"] for r in kept] == ["DeepSeek-R1", "DeepSeek-R1"]
    assert skipped == Counter({"overlong": 1, "teacher_unused": 2})
    with pytest.raises(ValueError, match=r"teachers_used names \['R1'\]"):
        used_teachers(rows, ["R1"], Counter())


def test_validation_samples_per_benchmark():
    """OGER's evaluation: avg@32 on AIME and AMC, avg@1 elsewhere; macro over the metrics they share."""
    v = ValidationConfig(
        benchmarks={"aime24": "a.jsonl", "math500": "m.jsonl"}, samples=1, samples_by_benchmark={"aime24": 32}
    )
    assert (v.samples_of("aime24"), v.samples_of("math500")) == (32, 1)
    names = v.metric_names()
    assert {"val/aime24/avg_at_32", "val/aime24/maj_at_16", "val/math500/avg_at_1"} <= set(names)
    assert "val/math500/avg_at_32" not in names
    assert [n for n in names if n.startswith("val/macro/")] == [
        "val/macro/pass_at_1",
        "val/macro/maj_at_1",
        "val/macro/response_length",
    ]
    assert macro_row({"aime24": {"avg@32": 0.2, "pass@1": 0.2}, "math500": {"avg@1": 0.6, "pass@1": 0.6}}) == {
        "pass@1": pytest.approx(0.4)
    }
    with pytest.raises(ValidationError, match="samples_by_benchmark"):
        ValidationConfig(samples_by_benchmark={"aime25": 32})


def test_ead_decay_counts_rl_steps():
    """d_s = min(d0 + 5 s, 40000) with s the rollout round, 1 at the first rollout (the official trainer's
    global_steps): a round of two optimizer steps moves d_s by 5, not 10."""
    assert [ead_decay(s, d0=25.0) for s in (1, 2, 3)] == [30.0, 35.0, 40.0]
    # tau_max sets the peak only approximately: at t = c the temperature is 1 + tau_max - exp(c / (S d_s)).
    assert ead_temperature(10, 1, tau_max=1.2, tau_min=0.1, d0=25.0) == pytest.approx(2.2 - 2.718281828 ** (10 / 600))
