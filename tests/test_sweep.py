"""The sweep: bad search specs at the edge, the dry run, and a real 3-trial sweep read back from
MLflow (sqlite, and a real `mlflow server` on 127.0.0.1), Optuna's storage and the best-trial spec."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml
from ray.util.state import list_placement_groups

from orchestrator import evaluate, report, sweep, train
from orchestrator.console import short_params
from orchestrator.spec import SpecError, load_sweep_spec, load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri

STEPS = 6


def spec_with(tmp_path, search: str):
    base = yaml.safe_load(open("search_spaces/ead.yaml"))
    base.pop("search")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(base) + textwrap.dedent(search))
    return path


@pytest.mark.parametrize(
    "search, expected",
    [
        (
            "search: {space: {rollout.decoding.ead.tau_maxx: {uniform: [1, 2]}}}\n",
            "search.space.rollout.decoding.ead.tau_maxx",
        ),
        ("search: {space: {}}\n", "space is empty"),
        (
            "search: {max_concurrent_trials: 0, space: {learner.lr: {value: 0.001}}}\n",
            "max_concurrent_trials: Input should be greater than or equal to 1",
        ),
        (
            "search: {metric: accuracy, space: {learner.lr: {value: 0.001}}}\n",
            "metric 'accuracy' is not a trial metric",
        ),
        ("search: {space: {learner.lr: {uniform: [2, 1]}}}\n", "low < high"),
        (
            "search: {space: {rollout.group_size: {int: [1, 4]}}}\n",
            "search.space.rollout.group_size: 1 does not make a valid trial",
        ),
        (
            "search: {final: {learner.stepz: 100}, space: {learner.lr: {value: 0.001}}}\n",
            "search.final: does not make a valid trial (learner.stepz: unknown key",
        ),
        (
            "search: {metric: val/aime24/avg_at_2, space: {learner.lr: {value: 0.001}}}\n",
            "search.metric: val/aime24/avg_at_2 is not a validation metric",
        ),
    ],
)
def test_bad_search_spec_is_one_line_naming_the_key(tmp_path, search, expected):
    with pytest.raises(SpecError) as info:
        load_sweep_spec(spec_with(tmp_path, search))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and expected in message, message


def test_optuna_state_is_the_trials_end(tmp_path):
    """A configuration that ran to its last step is COMPLETE with its final value; one the scheduler
    stopped (its durable record) PRUNED with the step it stopped at; an errored one, or one that ended
    short with no scheduler record and no seed record of its end, FAIL; intermediate values sit at RL steps."""
    from orchestrator.scheduler import record_pruned
    from orchestrator.searcher import StepOptunaSearch

    searcher = StepOptunaSearch(
        {"x": optuna.distributions.FloatDistribution(0, 1)},
        metric="val/accuracy",
        mode="max",
        tracking={"storage": str(tmp_path)},
    )
    record_pruned(str(tmp_path), "pruned", 10)
    at = {"finished": 30, "pruned": 10, "errored": 20, "short": 20}
    for trial_id, step in at.items():
        searcher.suggest(trial_id)
        for s in range(10, step + 1, 10):
            result = {
                "val/accuracy": s / 100,
                "val/accuracy_base": 0.05,
                "progress/step": s,
                "progress/val_step": s,
                "progress/steps": 30,
            }
            if s < step:
                searcher.on_trial_result(trial_id, result)
        searcher.on_trial_complete(trial_id, None if trial_id == "errored" else result, error=trial_id == "errored")
    trials = {t.user_attrs["tune_trial_id"]: t for t in searcher._ot_study.get_trials()}
    assert {k: t.state for k, t in trials.items()} == {
        "finished": optuna.trial.TrialState.COMPLETE,
        "pruned": optuna.trial.TrialState.PRUNED,
        "errored": optuna.trial.TrialState.FAIL,
        "short": optuna.trial.TrialState.FAIL,
    }
    assert trials["finished"].value == 0.30 and trials["finished"].intermediate_values == {
        0: 0.05,
        10: 0.1,
        20: 0.2,
        30: 0.3,
    }
    assert trials["pruned"].user_attrs["pruned_at_step"] == 10 and trials["pruned"].intermediate_values == {
        0: 0.05,
        10: 0.1,
    }
    assert trials["errored"].intermediate_values == {0: 0.05, 10: 0.1}


def test_closing_a_trial_never_holds_up_tunes_loop(monkeypatch):
    """A tracking server that takes 2 s to answer: Tune's callback returns at once, `closed()` waits."""
    import types

    from orchestrator import experiment
    from trainables.rollout import service

    class SlowTracker:
        closed: list = []

        def finish_sweep_trial(self, sweep, trial_id, state, description=None):
            time.sleep(2)
            self.closed.append((trial_id, state))

    monkeypatch.setattr(service, "remove_engine_group", lambda name: None)
    states = experiment.TrialStates(SlowTracker(), "s", [0], "val/accuracy")
    trial = types.SimpleNamespace(trial_id="t1", config={}, last_result={"progress/step": 3, "progress/steps": 3})
    start = time.perf_counter()
    states.on_trial_complete(0, [], trial)
    assert time.perf_counter() - start < 1 and SlowTracker.closed == []
    experiment.closed()
    assert SlowTracker.closed == [("t1", "finished")]


def test_a_proposal_lost_with_the_driver_fails_on_resume(tmp_path):
    """Tune saved its searcher after proposing "kept"; "lost" was proposed (written to the study) just
    before the driver died: the restored searcher marks it FAIL, "kept" runs on, and the lost configuration
    (which never ran: it may be the baseline) is the next one proposed."""
    from orchestrator.searcher import StepOptunaSearch

    def searcher():
        return StepOptunaSearch(
            {"x": optuna.distributions.FloatDistribution(0, 1)},
            metric="val/accuracy",
            mode="max",
            storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}"),
            study_name="s",
        )

    before = searcher()
    before.suggest("kept")
    before.save(str(tmp_path / "searcher.pkl"))
    before.suggest("lost")
    after = searcher()
    after.restore(str(tmp_path / "searcher.pkl"))
    trials = {
        t.user_attrs.get("tune_trial_id", "queued"): t
        for t in optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}").trials
    }
    assert trials["kept"].state == optuna.trial.TrialState.RUNNING
    assert trials["queued"].state == optuna.trial.TrialState.WAITING
    assert trials["lost"].state == optuna.trial.TrialState.FAIL and "driver" in trials["lost"].user_attrs["lost"]
    after.on_trial_complete("kept", {"val/accuracy": 0.5, "progress/step": 3, "progress/steps": 3})
    assert after._ot_study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert after.suggest("again") == {"x": trials["lost"].params["x"]}


def test_a_trial_told_finished_before_the_driver_was_lost_keeps_its_record(tmp_path):
    """The searcher was saved while "done" ran; "done" was then told COMPLETE, and the driver died before Tune
    saved again. Resumed, Tune runs "done" to its end once more: nothing is told twice (Optuna refuses to
    update a finished trial, which stopped the resumed sweep), and the study keeps its record."""
    from orchestrator.searcher import StepOptunaSearch

    def searcher():
        return StepOptunaSearch(
            {"x": optuna.distributions.FloatDistribution(0, 1)},
            metric="val/accuracy",
            mode="max",
            storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}"),
            study_name="s",
        )

    final = {"val/accuracy": 0.5, "progress/step": 5, "progress/val_step": 5, "progress/steps": 5}
    before = searcher()
    before.suggest("done")
    before.save(str(tmp_path / "searcher.pkl"))
    before.on_trial_complete("done", final)
    after = searcher()
    after.restore(str(tmp_path / "searcher.pkl"))
    after.on_trial_result("done", {**final, "val/accuracy": 0.4})
    after.on_trial_complete("done", {**final, "val/accuracy": 0.4}, error=True)
    (trial,) = after._ot_study.trials
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value == 0.5


def test_dry_run_prints_valid_proposals_and_starts_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.sweep", "search_spaces/ead.yaml", "--dry-run", "--storage", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "trial 0: {'rollout.decoding.ead.tau_max': 1.2, 'rollout.decoding.ead.d0': 25}" in out.stdout
    assert "trial 3:" in out.stdout and not list(tmp_path.iterdir())  # nothing written, nothing run


# A spec built so that ASHA must stop a configuration: lr 0.05 wrecks the policy within two steps, far
# below the first configuration's validation accuracy at the first rung. Two seeds each; the baseline
# is the first point (lr 0.0001). The third point repeats it: trials are deterministic, so it matches the
# baseline at every rung (ASHA keeps it) and the selection must find their paired difference exactly 0;
# the confirmation trains the two again on fresh seeds (2 and 3), where they are equal again: their
# differences are exactly 0, equivalent within the margin at the first look.
ASHA_SEARCH = f"""
search:
  metric: val/arithmetic/pass_at_2
  mode: max
  num_samples: 3
  seeds: 2
  scheduler: {{name: asha, grace_period: 2, reduction_factor: 2}}
  points_to_evaluate: [{{learner.lr: 0.0001}}, {{learner.lr: 0.05}}, {{learner.lr: 0.0001}}]
  space:
    learner.lr: {{choice: [0.0001, 0.05]}}
    learner.steps: {{value: {STEPS}}}
  final: {{learner.steps: 2, validation.every: 0}}
  confirm: {{seeds: 2, add: 1, max_seeds: 3, margin: 0.05}}
"""


@pytest.fixture(scope="module")
def finished_sweep(ray_cluster, tiny_model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    spec = spec_with(tmp, ASHA_SEARCH)
    args = argparse.Namespace(
        overrides=["validation.every=2", "validation.num_prompts=32"],
        num_samples=None,
        max_concurrent=None,
        dry_run=False,
        name="asha",
        storage=str(tmp / "runs"),
        tracking_uri=None,
        resume=False,
    )
    assert sweep.run(str(spec), args) == 0
    return tmp / "runs"


@pytest.mark.slow
def test_sweep_records_every_trial_and_stops_one_early(finished_sweep):
    tracker = Tracker(default_tracking_uri(str(finished_sweep)), "rlvr-explore")
    runs = tracker.client.search_runs([tracker.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("kind") == "trial" and r.data.tags["stage"] == "select"]
    assert len(trials) == 6  # 3 configurations x 2 seeds, each its own nested run
    configs: dict[str, list] = {}
    for run in trials:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["learner.lr"] in ("0.0001", "0.05")
        assert tracker.metric_history(run.info.run_id, "rollout/reward_mean")  # a history, step by step
        configs.setdefault(run.data.tags["config"], []).append(run)
    assert len(configs) == 3
    for seeds in configs.values():
        assert sorted(r.data.params["seed"] for r in seeds) == ["0", "1"]
        assert (
            len({r.data.params["learner.lr"] for r in seeds}) == 1 and len({r.data.tags["state"] for r in seeds}) == 1
        )
        assert "config/val/arithmetic/pass_at_2/mean" in seeds[0].data.metrics
    states = sorted(r.data.tags["state"] for r in trials)
    assert "pruned" in states and "finished" in states, states
    for run in trials:  # the run page says where and why a pruned run was stopped
        note = run.data.tags["mlflow.note.content"]
        assert (
            "Pruned at step 2: its val/arithmetic/pass_at_2 (" in note
            and "was below the cut-off (" in note
            and "of the rung of step 2" in note
        ) == (run.data.tags["state"] == "pruned"), note

    # The selection's estimate: the best configuration other than the baseline, paired seed by seed with it.
    tags, metrics = parent.data.tags, parent.data.metrics
    assert tags["verdict_config"] != tags["baseline"]
    final = {
        c: [r.data.metrics["val/arithmetic/pass_at_2"] for r in sorted(runs, key=lambda r: r.data.params["seed"])]
        for c, runs in configs.items()
    }
    diffs = [a - b for a, b in zip(final[tags["verdict_config"]], final[tags["baseline"]])]
    assert metrics["select/best_minus_baseline/mean"] == pytest.approx(sum(diffs) / 2) == 0
    assert metrics["select/best_minus_baseline/ci_low"] <= 0 <= metrics["select/best_minus_baseline/ci_high"]

    # The verdict comes from the confirmation: both again on seeds no selection run used, paired.
    confirm = [r for r in runs if r.data.tags.get("stage") == "confirm"]
    assert sorted((r.data.tags["config"], r.data.params["seed"]) for r in confirm) == sorted(
        (c, s) for c in (tags["verdict_config"], tags["baseline"]) for s in ("2", "3")
    )
    assert {r.data.tags["state"] for r in confirm} == {"finished"} and all(
        r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in confirm
    )
    fresh = {
        c: [
            r.data.metrics["val/arithmetic/pass_at_2"]
            for r in sorted(confirm, key=lambda r: r.data.params["seed"])
            if r.data.tags["config"] == c
        ]
        for c in (tags["verdict_config"], tags["baseline"])
    }
    fresh_diffs = [a - b for a, b in zip(fresh[tags["verdict_config"]], fresh[tags["baseline"]])]
    assert fresh_diffs == [0.0, 0.0] and metrics["confirm/seeds"] == 2  # decided at the first look
    assert metrics["confirm/best_minus_baseline/mean"] == metrics["confirm/best_minus_baseline/ci_low"] == 0
    assert tags["verdict"] == "equivalent" and tags["verdict_stage"] == "confirm"
    assert tags["final_config"] == tags["baseline"]  # not confirmed better: the baseline stands
    note = tags["mlflow.note.content"]  # the parent run's page opens on the verdict, its interval and what stands
    assert note.startswith("confirmed on fresh seeds: winner - baseline (val/arithmetic/pass_at_2) = +0.000 [")
    assert "equivalent to the baseline within +-0.05" in note and note.endswith("the final model trains it")
    assert "configurations.md" in [a.path for a in tracker.client.list_artifacts(parent.info.run_id)]
    # A pruned trial dies before its own clean-up: the driver removed its engines' placement group.
    left = [
        g.name
        for g in list_placement_groups(detail=True, limit=10_000)
        if g.name.startswith("rollout-engines-") and g.state != "REMOVED"
    ]
    assert not left, left
    assert parent.data.tags["state"] == "finished" and parent.data.tags["best_trial"]

    study = optuna.load_study(study_name="asha", storage=f"sqlite:///{finished_sweep / 'asha' / 'optuna.db'}")
    assert len(study.trials) == 3 and all(t.state.is_finished() for t in study.trials)

    best_spec = finished_sweep / "asha" / sweep.BEST_SPEC
    best = load_trial_spec(best_spec)  # valid input to orchestrator.train
    assert best.learner.lr == 0.0001 and best.learner.steps == 2  # the winner's lr, then search.final
    header = best_spec.read_text().splitlines()
    assert "best configuration" in header[0] and "biased upward" in header[1]  # how sure the selection is
    assert "confirmed on fresh seeds" in header[2] and "equivalent to the baseline within +-0.05" in header[2]
    assert "the baseline" in header[3] and "stands" in header[3]


@pytest.mark.slow
def test_every_metric_a_trial_logged_is_documented(finished_sweep):
    from trainables.metrics import documented

    tracker = Tracker(default_tracking_uri(str(finished_sweep)), "rlvr-explore")
    trials = [r for r in tracker.client.search_runs([tracker.experiment_id]) if r.data.tags.get("kind") == "trial"]
    logged = {name for run in trials for name in run.data.metrics}
    assert len(logged) > 60 and "val/arithmetic/pass_at_2" in logged
    assert sorted(name for name in logged if documented(name) is None) == []


@pytest.mark.slow
def test_mlflow_optuna_and_tune_agree_on_every_trial(finished_sweep):
    """Each client through its own API: a configuration ASHA stopped is pruned in all three (MLflow
    `FINISHED` with state `pruned` and a description saying so, Optuna `PRUNED`, Tune short of the last
    step), a finished one is finished in all three; Optuna's intermediate values sit at the RL steps of the
    validations."""
    from ray import tune

    tracker = Tracker(default_tracking_uri(str(finished_sweep)), "rlvr-explore")
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.artifact_location == (finished_sweep / "mlartifacts").as_uri()
    runs = [r for r in tracker.client.search_runs([tracker.experiment_id]) if r.data.tags.get("stage") == "select"]
    study = optuna.load_study(study_name="asha", storage=f"sqlite:///{finished_sweep / 'asha' / 'optuna.db'}")
    assert study.metric_names == ["val/arithmetic/pass_at_2"]
    optuna_trials = {t.user_attrs["tune_trial_id"]: t for t in study.trials}

    def trainable(config):  # Tune checks the name only: reading results runs nothing
        raise AssertionError("not run")

    grid = tune.Tuner.restore(str(finished_sweep / "asha" / "tune"), trainable).get_results()
    assert grid.get_best_result().metrics["val/arithmetic/pass_at_2"] == max(  # metric and mode recorded
        r.metrics["val/arithmetic/pass_at_2"] for r in grid if r.metrics["progress/step"] == STEPS
    )
    states = []
    for result in grid:
        trial_id, step = result.metrics["trial_id"], int(result.metrics["progress/step"])
        state = "finished" if step == STEPS else "pruned"
        mine = [r for r in runs if r.data.tags["config"] == trial_id]
        assert len(mine) == 2 and {(r.data.tags["state"], r.info.status) for r in mine} == {
            (state, "FINISHED")
        }  # the MLflow UI draws KILLED as a failure
        assert all(("Pruned" in r.data.tags["mlflow.note.content"]) == (state == "pruned") for r in mine)
        assert sorted(r.info.run_name for r in mine) == [f"lr={mine[0].data.tags['lr']} seed={s}" for s in (0, 1)]
        trial = optuna_trials[trial_id]
        assert trial.state == (
            optuna.trial.TrialState.COMPLETE if state == "finished" else optuna.trial.TrialState.PRUNED
        )
        assert sorted(trial.user_attrs["mlflow_run_ids"]) == sorted(r.info.run_id for r in mine)
        assert sorted(trial.intermediate_values) == list(range(0, step + 1, 2))  # base, then every validation
        states.append(state)
    assert sorted(states) == ["finished", "finished", "pruned"]


@pytest.mark.slow
def test_mlflow_server_serves_the_sweep(finished_sweep, mlflow_server, free_port):
    base = mlflow_server(default_tracking_uri(str(finished_sweep)), free_port) + "/api/2.0/mlflow"
    with urllib.request.urlopen(f"{base}/experiments/get-by-name?experiment_name=rlvr-explore") as r:
        experiment_id = json.load(r)["experiment"]["experiment_id"]
    request = urllib.request.Request(
        f"{base}/runs/search",
        method="POST",
        data=json.dumps({"experiment_ids": [experiment_id]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as r:
        runs = json.load(r)["runs"]
    kinds = sorted(t["value"] for run in runs for t in run["data"]["tags"] if t["key"] == "kind")
    assert kinds == ["sweep", *["trial"] * 10]  # 3 configurations x 2 seeds, and 2 x 2 confirmation runs


@pytest.mark.slow
def test_best_trial_trains_exports_registers_and_evaluates(finished_sweep, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert train.main(["--best-of", str(finished_sweep / "asha"), "--set", f"storage={tmp_path}"]) == 0
    model_dir = tmp_path / "asha-best" / "model"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("<think>", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]

    # Recorded where the sweep records (its best spec carries the tracking URI), and registered.
    tracker = Tracker(default_tracking_uri(str(finished_sweep)), "rlvr-explore")
    (run,) = [r for r in tracker.client.search_runs([tracker.experiment_id]) if r.info.run_name == "asha-best"]
    assert run.data.params["learner.lr"] == "0.0001" and run.data.params["learner.steps"] == "2"
    (version,) = tracker.client.search_model_versions("name = 'asha-best'")
    assert version.run_id == run.info.run_id
    assert "model/model.safetensors" in [a.path for a in tracker.client.list_artifacts(run.info.run_id, "model")]

    out = tmp_path / "eval.json"
    assert (
        evaluate.main(
            [
                str(model_dir),
                "--benchmarks",
                "arithmetic",
                "--limit",
                "4",
                "--samples",
                "2",
                "--out",
                str(out),
                "--tracking-uri",
                tracker.uri,
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["results"]["T0.6"]["arithmetic"]["avg@2"] >= 0


def assert_png(path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        image.verify()  # a real, complete PNG
        assert image.format == "PNG" and image.size[0] > 100


def test_smoothing_is_tensorboards_debiased_average():
    assert report.smoothed([0.4] * 6) == pytest.approx([0.4] * 6)  # no pull towards the zero start
    assert report.smoothed([0.0, 1.0, 1.0], weight=0.5) == pytest.approx([0.0, 0.5 / 0.75, 0.75 / 0.875])


def test_a_metric_equal_to_another_on_every_trial_shares_its_panel():
    """GRPO's reward is its accuracy: one panel, titled with both; a curve that differs on one trial keeps its own."""
    a, b = ([1, 2], [0.1, 0.2]), ([1, 2], [0.3, 0.4])
    titles = report.panel_titles(
        {
            "rollout/reward_mean": [a, b],
            "rollout/accuracy": [a, b],
            "policy/entropy": [a, a],
            "other": [a, ([1, 2], [0.3, 0.5])],
        }
    )
    assert titles == {
        "rollout/reward_mean": "rollout/reward_mean = rollout/accuracy",
        "policy/entropy": "policy/entropy",
        "other": "other",
    }


def test_the_legend_names_the_baseline_the_best_and_the_final_model():
    assert report.legend_marks({"baseline": "a", "selected_best": "b", "best_trial": "a", "other": "c"}) == {
        "a": "baseline & final model",
        "b": "best",
    }
    assert report.legend_marks({}) == {}


def test_a_parameter_searched_on_a_log_scale_is_plotted_on_one(tmp_path, monkeypatch):
    from types import SimpleNamespace

    figures = []
    monkeypatch.setattr(report, "save", lambda fig, path: figures.append(fig))
    trials = [
        SimpleNamespace(
            data=SimpleNamespace(
                metrics={"val/accuracy": v}, tags={"state": "finished"}, params={"d0": str(d0), "tau_max": "1.2"}
            )
        )
        for d0, v in ((5, 0.3), (50, 0.4), (500, 0.35))
    ]
    assert report.plot_objective(trials, ["d0", "tau_max"], "val/accuracy", tmp_path / "o.png", {"d0"})
    assert [ax.get_xscale() for ax in figures[0].axes] == ["log", "linear"]


def test_parameters_are_shown_short_and_rounded_whatever_their_type():
    shown = short_params(
        {
            "rollout.decoding.ead.tau_max": 1.2541928796033428,
            "rollout.decoding.ead.d0": "54.16654330531939",
            "learner.steps": "30",
            "a.seed": 3,
            "b.seed": "x",
            "model.path": "None",
        }
    )
    assert shown == {"tau_max": "1.25", "d0": "54.2", "steps": "30", "a.seed": "3", "b.seed": "x", "path": "None"}


@pytest.mark.slow
def test_report_of_the_sweep(finished_sweep):
    """The sweep wrote its report and put it in its parent run; `orchestrator.report` renders it again."""
    folder = finished_sweep / "asha" / "report"
    tracker = Tracker(default_tracking_uri(str(finished_sweep)), "rlvr-explore")
    (parent,) = tracker.client.search_runs([tracker.experiment_id], "tags.kind = 'sweep'")
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert {"report.md", "report.html", "validation.png"} <= set(written)
    assert {"report/report.html", "report/report.md"} <= {
        a.path for a in tracker.client.list_artifacts(parent.info.run_id, "report")
    }
    assert parent.data.metrics["sweep/report_s"] > 0
    assert report.main([str(finished_sweep / "asha")]) == 0
    assert all((folder / name).stat().st_mtime_ns >= mtime for name, mtime in written.items())
    for name in ("curves.png", "validation.png", "temperature.png", "objective.png"):
        assert_png(folder / name)
    summary = (folder / "report.md").read_text()
    assert "learner.lr" in summary and "val/accuracy" in summary
    assert len([line for line in summary.splitlines() if line.startswith("| ") and "0.0" in line]) >= 3
    assert "importance" in summary  # the ranking, or why there is none yet
    assert "95% interval over seeds" in summary and "baseline" in summary  # the configurations and the verdict
    logged = [a.path for a in tracker.client.list_artifacts(parent.info.run_id, "report")]
    assert {"report/report.md", "report/report.html", "report/curves.png"} <= set(logged)
    page = (folder / "report.html").read_text()  # what MLflow's artifact view shows: tables and every plot inside
    assert "<table>" in page and page.count('src="data:image/png;base64,') == summary.count("](") > 3
    assert 'src="curves.png"' not in page


@pytest.mark.slow
def test_a_moved_storage_folder_opens_every_artifact_from_its_new_place(finished_sweep, tmp_path, free_port):
    """The finished sweep's folder copied, opened there, then moved again (the copy deleted): MLflow's own
    client, `orchestrator.report` and the UI the sweep prints (`orchestrator.ui`) open every artifact
    from where the folder is now, and nothing is read or written at an old place."""
    import shutil

    from mlflow.tracking import MlflowClient

    from orchestrator.tracking import open_store

    original = {
        r.info.run_id: r.info.artifact_uri
        for r in MlflowClient(default_tracking_uri(str(finished_sweep))).search_runs([tracker_id(finished_sweep)])
    }
    first, moved = tmp_path / "first", tmp_path / "elsewhere" / "runs"
    shutil.copytree(finished_sweep, first)
    assert report.main([str(first / "asha")]) == 0
    shutil.move(first, moved)
    assert not first.exists()
    client = open_store(default_tracking_uri(str(moved)))
    runs = client.search_runs([tracker_id(moved)])
    assert {r.info.run_id for r in runs} == set(original)
    assert all(r.info.artifact_uri.startswith((moved / "mlartifacts").as_uri() + "/") for r in runs)
    for run in runs:  # every artifact of every run, listed and read through MLflow, as the files under `moved`
        for path in artifact_files(client, run.info.run_id):
            local = client.download_artifacts(run.info.run_id, path, str(tmp_path / "download" / run.info.run_id))
            assert (
                Path(local).read_bytes() == (moved / "mlartifacts" / run.info.run_id / "artifacts" / path).read_bytes()
            )
    assert sum(len(artifact_files(client, r.info.run_id)) for r in runs) >= 10
    assert report.main([str(moved / "asha")]) == 0 and not first.exists()  # the report writes into the new place
    assert all(
        v.source.startswith((moved / "mlartifacts").as_uri())
        for v in client.search_model_versions()
        if v.source.startswith("file://")
    )
    # The original, still where it was, still points at itself.
    assert {
        r.info.run_id: r.info.artifact_uri
        for r in MlflowClient(default_tracking_uri(str(finished_sweep))).search_runs([tracker_id(finished_sweep)])
    } == original

    # The command the sweep prints, on the moved folder: the UI serves the parent run's report.
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    ui = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.ui", str(moved), "--port", str(free_port)],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{free_port}/get-artifact?path=report/report.md&run_uuid={parent.info.run_id}"
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    served = response.read()
                break
            except OSError:
                assert time.time() < deadline and ui.poll() is None, "orchestrator.ui did not come up"
                time.sleep(1)
        assert served == (moved / "asha" / "report" / "report.md").read_bytes()
    finally:
        ui.terminate()
        ui.wait(timeout=30)


def tracker_id(storage) -> str:
    return Tracker(default_tracking_uri(str(storage)), "rlvr-explore").experiment_id


def artifact_files(client, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_files(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def test_with_a_bucket_the_study_is_where_a_resume_elsewhere_finds_it(tmp_path):
    """The study lives on the driver's disk (sqlite); its copy beside the sweep in the bucket (here a
    file:// URI, through the same pyarrow filesystem layer as s3:// and gs://) comes back on a machine
    that lacks it, and never replaces a study a machine has."""
    from orchestrator.experiment import fetch_study, save_study

    here, there, bucket = tmp_path / "here", tmp_path / "there", f"file://{tmp_path}/bucket/s"
    here.mkdir()
    there.mkdir()
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{here / 'optuna.db'}")
    study.tell(study.ask(), 0.5)
    save_study(here, bucket)
    fetch_study(there, bucket)
    copy = optuna.load_study(study_name="s", storage=f"sqlite:///{there / 'optuna.db'}")
    assert [t.value for t in copy.trials] == [0.5]
    study.tell(study.ask(), 0.7)
    fetch_study(there, bucket)  # there already has one: kept
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{there / 'optuna.db'}").trials) == 1
    fetch_study(tmp_path / "empty", "file:///nonexistent/bucket")  # nothing to fetch: nothing happens


def test_the_named_sampler_is_the_one_that_proposes():
    """The default sweep's 4 configurations: TPE models from the third (n_startup_trials 2), where
    Optuna's default of 10 would leave all four to random search; `random` says so."""
    _, search, _ = load_sweep_spec("search_spaces/ead.yaml", check_files=False)
    sampler = sweep.make_sampler(search)
    assert isinstance(sampler, optuna.samplers.TPESampler) and sampler._n_startup_trials == 2 < search.num_samples
    search.sampler.name = "random"
    assert isinstance(sweep.make_sampler(search), optuna.samplers.RandomSampler)


@pytest.mark.parametrize(
    "confirm, expected",
    [
        ("{seeds: 3, max_seeds: 2}", "max_seeds must be >= seeds"),
        ("{seeds: 1}", "one pair measures no seed spread"),
        ("{seeds: 3, margin: -0.1}", "search: confirm.margin: Input should be greater than 0"),
    ],
)
def test_bad_confirmation_is_one_line(tmp_path, confirm, expected):
    spec = spec_with(
        tmp_path,
        f"search: {{confirm: {confirm}, points_to_evaluate: [{{learner.lr: 0.001}}], "
        f"space: {{learner.lr: {{uniform: [0.0001, 0.01]}}}}}}\n",
    )
    with pytest.raises(SpecError) as info:
        load_sweep_spec(spec)
    assert len(str(info.value).splitlines()) == 1 and expected in str(info.value), str(info.value)


def test_confirmation_needs_a_baseline(tmp_path):
    spec = spec_with(tmp_path, "search: {confirm: {seeds: 3}, space: {learner.lr: {uniform: [0.0001, 0.01]}}}\n")
    with pytest.raises(SpecError, match="confirm needs one objective and a baseline"):
        load_sweep_spec(spec)


def test_a_configuration_is_pruned_only_where_the_scheduler_said_so(tmp_path):
    """The scheduler writes each stop before Tune acts on it; how a configuration ended is read from
    durable records: its last report, the scheduler's record, or its seeds' own MLflow steps."""
    from ray.tune.schedulers import TrialScheduler

    from orchestrator.scheduler import IntervalRungs, pruned_at, pruned_record
    from orchestrator.seeds import outcome

    scheduler = IntervalRungs([10], record_to=str(tmp_path))
    scheduler.set_search_properties("val/accuracy", "max")
    rung = {"progress/step": 10, "progress/val_step": 10}
    assert (
        scheduler.decide("a", {**rung, "seeds/0/val/accuracy": 0.50, "seeds/1/val/accuracy": 0.52})
        == TrialScheduler.CONTINUE
    )
    assert (
        scheduler.decide("b", {**rung, "seeds/0/val/accuracy": 0.10, "seeds/1/val/accuracy": 0.11})
        == TrialScheduler.STOP
    )
    assert pruned_at(str(tmp_path), "b") == 10 and pruned_at(str(tmp_path), "a") is None
    # Why, in numbers: b's upper bound 0.105 + t(0.975, 2) x 0.0112 / sqrt(2) against a's lower bound.
    step, why = pruned_record(str(tmp_path), "b")
    assert "upper bound of val/accuracy (0.139)" in why and "lower bound (0.476)" in why and "step 10" in why
    (tmp_path / "pruned" / "c.json").write_text("{broken")
    assert pruned_at(str(tmp_path), "c") is None  # a record that does not read is no decision

    short = {"progress/step": 10, "progress/steps": 30}
    assert outcome({"progress/step": 30, "progress/steps": 30}, None, []) == "finished"
    assert outcome({}, None, [(30, 30), (30, 30)]) == "finished"  # the last report lost; every seed logged step 30
    assert outcome(short, 10, []) == "pruned"
    assert outcome(short, None, [(30, 30), (20, 30)]) == "errored"  # short, and no decision: never "pruned"
    assert outcome({}, None, []) == "errored"


def test_asha_records_its_stops_but_not_a_trial_that_reached_the_horizon(tmp_path):
    """Ray's ASHA also answers STOP to a trial at max_t (it ended, not pruned): only a stop before it is a record."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from orchestrator.scheduler import RecordedASHA, pruned_at, pruned_record

    asha = RecordedASHA(time_attr="progress/step", max_t=5, grace_period=2, reduction_factor=2, record_to=str(tmp_path))
    asha.set_search_properties("val/accuracy", "max")
    trials = [SimpleNamespace(trial_id=name) for name in "abc"]
    for trial in trials:
        asha.on_trial_add(None, trial)
    asha.on_trial_result(None, trials[0], {"progress/step": 2, "val/accuracy": 0.9})
    assert asha.on_trial_result(None, trials[0], {"progress/step": 5, "val/accuracy": 0.9}) == TrialScheduler.STOP
    assert asha.on_trial_result(None, trials[1], {"progress/step": 2, "val/accuracy": 0.1}) == TrialScheduler.STOP
    assert pruned_at(str(tmp_path), "a") is None and pruned_at(str(tmp_path), "b") == 2
    _, why = pruned_record(str(tmp_path), "b")
    assert "val/accuracy (0.100) was below the cut-off (0.900) of the rung of step 2: " in why


def test_a_sweeps_seeds_print_no_step_lines_unless_the_spec_asks():
    """The configuration events carry a sweep's progress; a spec that names `logging.progress_every` keeps it."""
    from orchestrator.seeds import seed_configs
    from trainables.config import TrialConfig

    for base, expected in (
        ({}, 0),
        ({"logging": {"tracking_uri": "sqlite:///x.db"}}, 0),
        ({"logging": {"progress_every": 5}}, 5),
    ):
        cfgs = seed_configs(base, {"learner.lr": 0.001}, "c1", "runs", 2)
        assert [c.logging.progress_every for c in cfgs] == [expected, expected] and cfgs[1].seed == 1
    assert TrialConfig().logging.progress_every == 1  # one trial, `train`: a line a step
