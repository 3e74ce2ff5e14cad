"""Studies (orchestrator.study): bad specs at the edge, the shipped studies valid, and a real 2-arm x
2-seed study whose study.json equals what its MLflow runs say."""

from __future__ import annotations

import argparse
import json
import math
import textwrap

import pytest
import yaml
from scipy import stats

from orchestrator import study
from orchestrator.spec import SpecError
from orchestrator.tracking import Tracker, default_tracking_uri

BASE_OVERRIDES = [
    "learner.steps=2",
    "validation.every=2",
    "validation.num_prompts=16",
    "validation.samples=2",
    "learner.prompts_per_step=4",
]


def spec_with(tmp_path, section: str):
    base = yaml.safe_load(open("search_spaces/ead.yaml"))
    base.pop("search")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(base) + textwrap.dedent(section))
    return path


@pytest.mark.parametrize(
    "section, expected",
    [
        ("study: {arms: {only: {}}}\n", "study: arms: name at least two arms"),
        ("study: {arms: {'../x': {}, b: {}}}\n", "'../x' is not an arm name"),
        (
            "study: {arms: {a: {}, b: {rollout.decoding.ead.tau_maxx: 1}}}\n",
            "study.arms.b: rollout.decoding.ead.tau_maxx",
        ),
        ("study: {arms: {a: {}, b: {}}, seeds: 0}\n", "study: seeds"),
        ("study: {arms: {a: {}, b: {}}, metric: accuracy}\n", "'accuracy' is not a trial metric"),
        ("arms: {a: {}, b: {}}\n", "study: missing"),
    ],
)
def test_bad_study_spec_is_one_line_naming_the_key(tmp_path, section, expected):
    with pytest.raises(SpecError) as info:
        study.load_study_spec(spec_with(tmp_path, section))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and expected in message, message


@pytest.mark.parametrize(
    "spec, arms",
    [
        ("search_spaces/studies/ead_vs_fixed.yaml", 4),
        ("search_spaces/studies/oger_ablation.yaml", 5),
        ("search_spaces/studies/overlap_lag.yaml", 2),
    ],
)
def test_shipped_studies_are_valid(spec, arms):
    _, config, _ = study.load_study_spec(spec)
    assert config.seeds >= 3 and len(config.arms) == arms


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Student t, computed here independently of orchestrator.stats."""
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


@pytest.mark.slow
def test_two_arms_two_seeds_match_their_mlflow_runs(ray_cluster, tiny_model_path, tmp_path):
    spec = spec_with(
        tmp_path,
        """
        study:
          seeds: 2
          seed_runs: 1  # an arm's seeds in one run (a sweep's test splits them over two)
          arms:
            ead: {}
            fixed_1.0: {rollout.decoding.schedule: fixed, rollout.decoding.temperature: 1.0}
        """,
    )
    args = argparse.Namespace(
        overrides=BASE_OVERRIDES,
        seeds=None,
        max_concurrent=None,
        dry_run=False,
        name="st",
        storage=str(tmp_path / "runs"),
        tracking_uri=None,
        resume=False,
    )
    assert study.run(str(spec), args) == 0
    folder = tmp_path / "runs" / "st"
    result = json.loads((folder / "study.json").read_text())
    for name in ("curves.png", "pass_at_k.png", "study.md"):
        assert (folder / name).stat().st_size > 1000

    tracker = Tracker(default_tracking_uri(str(tmp_path / "runs")), "rlvr-explore")
    runs = tracker.client.search_runs([tracker.experiment_id], "tags.kind = 'trial'")
    assert len(runs) == 4
    finals = {}
    for run in runs:
        arm, seed = run.data.tags["arm"], int(run.data.params["seed"])
        assert run.data.tags["config"] and run.data.params["task.seed"] == "0" and run.data.tags["state"] == "finished"
        finals.setdefault(arm, {})[seed] = run.data.metrics["val/accuracy"]
    assert {arm: sorted(v) for arm, v in finals.items()} == {"ead": [0, 1], "fixed_1.0": [0, 1]}
    for arm, by_seed in finals.items():
        row = result["arms"][arm]["final"]["val/accuracy"]
        assert row["values"] == [by_seed[0], by_seed[1]]
        assert (row["mean"], row["ci_low"], row["ci_high"]) == pytest.approx(t_interval([by_seed[0], by_seed[1]]))
        assert result["arms"][arm]["seeds"] == [0, 1]
    diffs = [finals["fixed_1.0"][s] - finals["ead"][s] for s in (0, 1)]
    row = result["differences"]["fixed_1.0"]["val/accuracy"]
    if diffs[0] == diffs[1]:
        assert row["ci_low"] == row["ci_high"] == pytest.approx(diffs[0])
    else:
        assert (row["mean"], row["ci_low"], row["ci_high"]) == pytest.approx(t_interval(diffs))
    # The entropy curve: mean over the seeds at each step, from the runs' histories.
    curve = result["arms"]["ead"]["curves"]["policy/entropy"]
    by_step = [
        dict((m.step, m.value) for m in tracker.client.get_metric_history(r.info.run_id, "policy/entropy"))
        for r in runs
        if r.data.tags["arm"] == "ead"
    ]
    assert curve["steps"] == [1, 2]
    assert curve["mean"] == pytest.approx([(by_step[0][s] + by_step[1][s]) / 2 for s in (1, 2)])
    # Sample efficiency: each seed's objective averaged over its validations after the base one.
    areas = [
        [m.value for m in tracker.client.get_metric_history(r.info.run_id, "val/accuracy") if m.step > 0]
        for r in sorted((r for r in runs if r.data.tags["arm"] == "ead"), key=lambda r: int(r.data.params["seed"]))
    ]
    assert result["arms"]["ead"]["final"]["val/accuracy/mean_over_validations"]["values"] == pytest.approx(
        [sum(a) / len(a) for a in areas]
    )
    (parent,) = tracker.client.search_runs([tracker.experiment_id], "tags.kind = 'sweep'")
    assert parent.data.tags["experiment_kind"] == "study" and parent.data.tags["state"] == "finished"
    assert "study.json" in [a.path for a in tracker.client.list_artifacts(parent.info.run_id)]
    # The study ends with its report, on disk and in its parent run.
    assert {"report/report.html", "report/report.md"} <= {
        a.path for a in tracker.client.list_artifacts(parent.info.run_id, "report")
    }
    assert "val/accuracy" in (folder / "report" / "report.md").read_text()


def test_primary_verdicts_are_holm_adjusted_and_the_rest_exploratory():
    """Two arms against the first, each with a paired p-value under 0.05 alone (0.035 and 0.049): Holm's
    first step doubles the smaller (0.07), so neither claim survives the family; entropy, a secondary
    metric, keeps its own interval's verdict and is labelled exploratory."""
    from scipy import stats

    from orchestrator.study import differences

    def arm(acc, ent):
        return {"final": {"val/accuracy": {"values": acc}, "policy/entropy": {"values": ent}}}

    arms = {
        "a": arm([0.40, 0.42, 0.41], [0.10, 0.11, 0.12]),
        "b": arm([0.44, 0.45, 0.43], [0.20, 0.21, 0.22]),
        "c": arm([0.445, 0.45, 0.43], [0.10, 0.11, 0.12]),
    }
    p_b = stats.ttest_1samp([0.04, 0.03, 0.02], 0).pvalue
    p_c = stats.ttest_1samp([0.045, 0.03, 0.02], 0).pvalue
    assert p_b < p_c < 0.05 < 2 * p_b
    rows = differences(arms, "max", "val/accuracy")
    assert rows["b"]["val/accuracy"]["p_holm"] == pytest.approx(2 * p_b)
    assert rows["c"]["val/accuracy"]["p_holm"] == pytest.approx(2 * p_b)  # max(2 p_b, p_c): Holm is monotone
    assert [rows[n]["val/accuracy"]["verdict"] for n in "bc"] == ["inconclusive", "inconclusive"]
    assert rows["b"]["val/accuracy"]["ci_low"] > 0  # the unadjusted interval alone would have said "better"
    assert {rows[n]["policy/entropy"]["role"] for n in "bc"} == {"exploratory"}
    assert rows["b"]["policy/entropy"]["verdict"] == "better" and "exploratory" in rows["b"]["policy/entropy"]["line"]
    # With a margin of 0.1, TOST's p-values (0.003, 0.006) pass Holm: equivalent within +-0.1.
    with_margin = differences(arms, "max", "val/accuracy", margin=0.1)
    assert [with_margin[n]["val/accuracy"]["verdict"] for n in "bc"] == ["equivalent", "equivalent"]


def test_arms_measured_at_other_steps_or_by_another_validation_are_not_compared():
    """An arm whose seeds stopped at another step, or whose overrides change the validation, gets no verdict
    and leaves the Holm family: the remaining arm's p-value is its own."""
    from scipy import stats

    from orchestrator.study import differences, markdown

    def arm(acc, steps=(30, 30, 30), **overrides):
        return {"overrides": overrides, "steps": list(steps), "final": {"val/accuracy": {"values": acc}}}

    arms = {
        "a": arm([0.40, 0.42, 0.41]),
        "b": arm([0.44, 0.45, 0.43]),
        "early": arm([0.30, 0.31, 0.29], steps=(30, 20, 30)),
        "k8": arm([0.50, 0.52, 0.51], **{"validation.samples": 8}),
    }
    rows = differences(arms, "max", "val/accuracy")
    assert (
        rows["early"]["val/accuracy"]["verdict"] == "not compared"
        and "different steps" in rows["early"]["val/accuracy"]["line"]
    )
    assert (
        rows["k8"]["val/accuracy"]["verdict"] == "not compared"
        and "validation.samples" in rows["k8"]["val/accuracy"]["line"]
    )
    assert rows["b"]["val/accuracy"]["p_holm"] == pytest.approx(stats.ttest_1samp([0.04, 0.03, 0.02], 0).pvalue)
    table = markdown(
        {
            "name": "s",
            "metric": "val/accuracy",
            "seeds": 3,
            "margin": None,
            "differences": rows,
            "noise": {"validation_se": 0.02, "seed_sd": None},
            "arms": {
                n: {
                    "final": {
                        "val/accuracy": {
                            "values": a["final"]["val/accuracy"]["values"],
                            "mean": 0.4,
                            "ci_low": 0.3,
                            "ci_high": 0.5,
                        }
                    }
                }
                for n, a in arms.items()
            },
        }
    )
    assert "| early | val/accuracy | primary | - | - | not compared: their values come from different steps" in table


def test_a_comparison_refuses_sides_from_other_steps_or_validations():
    from orchestrator.summary import ConfigSummary, compare, incomparable

    def summary(values, steps=30, **params):
        return ConfigSummary("c", params, "finished", steps, values, None, None, {})

    base = summary([0.40, 0.42, 0.41])
    assert compare(summary([0.44, 0.45, 0.43]), base, "max") is not None
    assert compare(summary([0.44, 0.45, 0.43], steps=20), base, "max") is None
    assert compare(summary([0.44, 0.45, 0.43], **{"validation.decoding.temperature": 1.0}), base, "max") is None
    assert compare(summary([0.44, 0.45, 0.43], **{"rollout.decoding.ead.tau_max": 1.4}), base, "max") is not None
    assert "rollout.max_new_tokens" in incomparable({"rollout.max_new_tokens": 32}, {}, 30, 30)
