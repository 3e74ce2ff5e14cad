"""One real trial end to end: Ray Train workers, DeepSpeed over gloo, the rollout actor, math-verify,
MLflow on sqlite, and the policy measurably gets better on held-out problems."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator import train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from trainables.tasks import builtin_validation

STEPS = 30
# The warm-started base boxes its answer only about half the time (`model.tiny.sft_unboxed_rate`),
# so the verifier's reward has a real habit to teach. Measured with search_spaces/ead.yaml, 200 training
# and 200 validation problems, 4 samples each, after 30 steps: val/accuracy 0.23 -> 0.42 (AMD EPYC, AVX2),
# 0.18 -> 0.28 (Intel Xeon, AVX-512): another CPU's floating point is another draw of the same run. With
# the loss sign flipped the same recipe falls to 0.0 within 10 steps, and at lr 1e-3 it collapses to 0.0
# too; an idle learner stays at the base within the validation noise. The default's 80 training problems
# take seed 0 only from 0.205 to 0.244 (its weak seed: docs/science.md), hence the larger task here.
Z_95 = 1.645  # one-sided 95%


def gain_lower_bound(final: dict[str, float]) -> tuple[float, float]:
    """(val/accuracy's gain over the base policy, its one-sided 95% lower bound from the two validations'
    measured standard errors).

    Not paired, so conservative (a problem that was easy stays easy: the covariance only shrinks the
    true error). The objective averages two benchmarks that hold the same problems (the MATH-500 copy),
    which the reported error treats as independent: x sqrt(2) gives the error of one of them.
    """
    gain = final["val/accuracy"] - final["val/accuracy_base"]
    se = math.sqrt(2 * (final["val/accuracy_se"] ** 2 + final["val/accuracy_se_base"] ** 2))
    return gain, gain - Z_95 * se


def math500_copy_of_validation(cfg, path, overlong: bool = False):
    """The built-in validation split in MATH-500's layout, each gold answer written as "42.0": equal to
    the model's "42" only under math-verify; `overlong`: led by a question of 400,000 characters."""
    rows = [
        {"problem": p.question, "answer": f"{p.answer}.0", "unique_id": p.uid}
        for p in builtin_validation(cfg.task, cfg.task_seed)
    ]
    if overlong:
        rows.insert(0, {"problem": "1 + " * 100_000 + "1 = ?", "answer": "100001", "unique_id": "overlong"})
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0, 1], ids=["synchronous", "generation_overlapped"])
def test_grpo_with_ead_improves_held_out_accuracy(ray_cluster, tiny_model_path, tmp_path, overlap):
    """The policy is better than its base on held-out problems: the gain's one-sided 95% lower bound, from
    the validation's own measured noise (about 0.05 here), is above 0. Also with rollout.overlap 1 (one
    step behind the engines).

    Why it does not flake on another CPU: no fixed margin that one machine's draw sets. The gains
    measured (0.10 to 0.19 on three CPUs) sit two to four bounds' widths above 0, a broken learner (sign
    flipped, collapsed, idle) at or below 0.
    """
    cfg = load_trial_spec(
        "search_spaces/ead.yaml",
        [
            f"storage={tmp_path}",
            f"learner.steps={STEPS}",
            f"validation.every={STEPS}",
            "validation.samples=4",
            "task.train_size=200",
            "task.val_size=200",
            "validation.num_prompts=200",
            f"rollout.overlap={overlap}",
        ],
    )
    copy = math500_copy_of_validation(cfg, tmp_path / "math500.jsonl")
    cfg.validation.benchmarks = {"arithmetic": None, "math500": str(copy)}
    final = train.run(cfg)
    gain, low = gain_lower_bound(final)
    print(
        f"val/accuracy {final['val/accuracy_base']:.3f} -> {final['val/accuracy']:.3f}: gain {gain:+.3f}, "
        f"one-sided 95% bound {low:+.3f}"
    )
    assert low > 0, (
        f"val/accuracy {final['val/accuracy_base']:.3f} -> {final['val/accuracy']:.3f}: "
        f"gain {gain:+.3f}, 95% bound {low:+.3f}"
    )
    # The in-training validation is orchestrator.evaluate's table: every metric of the spec, consistent.
    assert set(cfg.validation.metric_names()) <= set(final)
    for bench in ("arithmetic", "math500", "macro"):
        row = {
            key: final[f"val/{bench}/{key}"]
            for key in ("avg_at_4", "pass_at_1", "pass_at_2", "pass_at_4", "maj_at_4", "worst_at_4")
        }
        assert row["pass_at_1"] == pytest.approx(row["avg_at_4"])  # n = k: the estimator is the mean
        assert row["worst_at_4"] <= row["avg_at_4"] <= row["pass_at_2"] <= row["pass_at_4"]
        assert 0 < row["maj_at_4"] <= row["pass_at_4"]
    mean = (final["val/arithmetic/avg_at_4"] + final["val/math500/avg_at_4"]) / 2
    assert final["val/accuracy"] == pytest.approx(mean) == final["val/macro/avg_at_4"]

    # The record: every step of the run is in MLflow, the base policy at step 0.
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    assert run.data.tags["state"] == "finished"
    steps = [step for step, _ in tracker.metric_history(run.info.run_id, "rollout/reward_mean")]
    assert steps == list(range(1, STEPS + 1))
    lags = [lag for _, lag in tracker.metric_history(run.info.run_id, "rollout/policy_lag")]
    assert lags == [0.0] + [float(overlap)] * (STEPS - 1)
    # val/accuracy's curve starts at the base policy (step 0); its `_base` copy is one point, not a series.
    (base,) = tracker.metric_history(run.info.run_id, "val/accuracy_base")
    curve = tracker.metric_history(run.info.run_id, "val/accuracy")
    assert base[0] == 0 and curve[0] == base and [s for s, _ in curve][-1] == STEPS


OGER_METRICS = (
    "oger/divergence_mean",
    "oger/last_token_entropy_mean",
    "oger/exploration_mean",
    "oger/exploration_max",
    "offline/replaced",
    "offline/accuracy",
    "rollout/accuracy_online_kept",
    "policy/offpolicy_token_share",
    "timing/encoder",
    "offline/advantage_mean",
)


@pytest.mark.slow
def test_oger_trial_runs_and_records_its_metrics(ray_cluster, tiny_model_path, tmp_path):
    steps = 3
    cfg = load_trial_spec(
        "search_spaces/oger.yaml", [f"storage={tmp_path}", f"learner.steps={steps}", "validation.every=0"]
    )
    final = train.run(cfg)
    assert final["offline/replaced"] == cfg.learner.prompts_per_step * cfg.algorithm.replacement_density
    assert 0 < final["policy/offpolicy_token_share"] < 1
    assert 0 < final["timing/encoder"] < final["timing/step"] * cfg.learner.num_workers  # each rank's texts, once
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    for key in OGER_METRICS:
        assert [s for s, _ in tracker.metric_history(run.info.run_id, key)] == list(range(1, steps + 1)), key
    # The store's per-teacher table (the paper's Table 1) is part of the record.
    assert run.data.metrics["offline/stepwise/valid"] > 0
    table = open(tracker.client.download_artifacts(run.info.run_id, "offline_store.txt", str(tmp_path))).read()
    assert all(teacher in table for teacher in ("terse", "stepwise", "verbose"))


@pytest.mark.slow
def test_ead_decay_follows_rl_steps_with_two_minibatches(ray_cluster, tiny_model_path, tmp_path):
    """d_s = d0 + 5 s at RL step s = 1, 2, 3 although each step makes two optimizer steps; validation samples
    each benchmark its own k (avg@2 on one, avg@1 on the other), a problem past the context skipped; the
    learner runs micro-batches sized by tokens with gradient checkpointing, and reports their padding."""
    steps = 3
    cfg = load_trial_spec(
        "search_spaces/ead.yaml",
        [
            f"storage={tmp_path}",
            f"learner.steps={steps}",
            "learner.minibatches=2",
            f"validation.every={steps}",
            "validation.num_prompts=8",
            "validation.samples=2",
            "learner.max_tokens_per_micro_batch=400",
            "learner.gradient_checkpointing=true",
        ],
    )
    copy = math500_copy_of_validation(cfg, tmp_path / "m.jsonl", overlong=True)  # skipped: it never reaches an engine
    cfg.validation.benchmarks = {"arithmetic": None, "math500": str(copy)}
    cfg.validation.samples_by_benchmark = {"math500": 1}
    final = train.run(cfg)
    assert final["progress/optimizer_step"] == 2 * steps
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    d0 = cfg.rollout.decoding.ead.d0
    assert sorted(tracker.metric_history(run.info.run_id, "rollout/ead_decay")) == [
        (s, d0 + 5 * s) for s in range(1, steps + 1)
    ]
    assert final["val/accuracy"] == pytest.approx(
        (final["val/arithmetic/avg_at_2"] + final["val/math500/avg_at_1"]) / 2
    )
    assert "val/math500/avg_at_2" not in final and "val/macro/pass_at_1" in final
    assert set(cfg.validation.metric_names()) <= set(final)
    pads = [v for _, v in tracker.metric_history(run.info.run_id, "learner/pad_fraction")]
    assert len(pads) == steps and all(0 <= v < 0.5 for v in pads), pads
