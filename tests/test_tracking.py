"""MLflow going away never stops a trial: run creation retries then goes on untracked, and per-step
metrics and artifacts are buffered while a real tracking server is down and sent once it is back."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.tracking import Tracker, default_tracking_uri
from trainables.config import TrialConfig
from trainables.runtime.step_log import StepLogger


@pytest.fixture(autouse=True)
def fail_fast(monkeypatch):
    """MLflow's own HTTP retries take minutes against a dead server; ours are what is under test."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def test_run_creation_against_a_dead_server_gives_up_without_raising(free_port):
    tracker = Tracker(f"http://127.0.0.1:{free_port}", "rlvr-explore", retry_waits_s=(0.1, 0.1))
    assert tracker.start_trial_run(TrialConfig()) is None
    tracker.finish(None, "finished")  # closing an untracked run is a no-op, not an error


def test_step_logger_buffers_while_the_server_is_down(tmp_path, free_port, mlflow_server):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = Tracker(store, "rlvr-explore").start_trial_run(TrialConfig(name="buffered"))
    logger = StepLogger(f"http://127.0.0.1:{free_port}", run_id)  # the server is not up yet
    for step in range(3):
        logger.log(step, {"rollout/reward_mean": step / 10})
    logger.log_file("rollouts/step_000003.jsonl", '{"reward": 1.0}\n')
    logger.drain()
    assert logger.failing_since is not None and len(logger.pending) == 3 and logger.pending_files

    mlflow_server(store, free_port)
    logger.log(3, {"rollout/reward_mean": 0.3})
    logger.close()
    assert logger.failing_since is None and not logger.pending and not logger.pending_files
    client = MlflowClient(store)
    history = client.get_metric_history(run_id, "rollout/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3)]
    assert [a.path for a in client.list_artifacts(run_id, "rollouts")] == ["rollouts/step_000003.jsonl"]


def test_experiments_are_training_kind_with_artifacts_inside_their_storage(tmp_path, monkeypatch):
    """Two storages used from one working directory: each keeps its own artifacts, nothing lands in the cwd."""
    monkeypatch.chdir(tmp_path)
    for storage in ("a", "b"):
        tracker = Tracker(default_tracking_uri(str(tmp_path / storage)), "rlvr-explore")
        run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
        tracker.client.log_text(run_id, storage, "which.txt")
        experiment = tracker.client.get_experiment(tracker.experiment_id)
        assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
        (written,) = (tmp_path / storage).rglob("which.txt")
        assert written.read_text() == storage and written.is_relative_to(tmp_path / storage / "mlartifacts")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no mlruns/ beside them


@pytest.mark.parametrize("folder", ["researcher's runs", 'the "final" runs'])
def test_storage_paths_with_quotes_are_tracked_like_any_other(tmp_path, folder):
    storage = tmp_path / folder
    tracker = Tracker(default_tracking_uri(str(storage)), "rlvr-explore")
    cfg = TrialConfig(name="trial", storage=str(storage))
    run_id = tracker.start_trial_run(cfg)
    assert run_id and tracker.find_trial_run(f"{storage}/trial") == run_id
    assert tracker.start_trial_run(cfg, resume=True) == run_id  # the resume finds the run by its path


def test_the_trials_view_is_a_view_saved_in_the_experiment(tmp_path):
    """The link a sweep prints opens the MLflow UI's runs page on a view saved as an experiment tag: the
    sweep's trial runs (a filter MLflow's own search accepts), ranked by the objective, grouped by
    configuration, its chart first and the other sections folded, the searched parameters as columns."""
    from orchestrator import view

    tracker = Tracker(default_tracking_uri(str(tmp_path)), "rlvr-explore")
    assert tracker.trials_view("ead", "val/accuracy", ["lr"]) is None  # no call made to find the experiment
    parent = tracker.client.create_run(tracker.experiment_id, tags={"kind": "sweep", "sweep": "ead"}).info.run_id
    for sweep in ("ead", "ead", "other"):
        run = tracker.client.create_run(
            tracker.experiment_id, tags={"kind": "trial", "sweep": sweep, "mlflow.parentRunId": parent}
        )
        for key in ("val/accuracy", "val/accuracy_se", "policy/entropy", "timing/step"):
            tracker.client.log_metric(run.info.run_id, key, 0.5, step=1)
    url = urllib.parse.urlsplit(tracker.trials_view("ead", "val/accuracy", ["lr"]))
    path, query = url.fragment.split("?")
    assert path == f"/experiments/{tracker.experiment_id}/runs"
    params = dict(urllib.parse.parse_qsl(query))
    assert params["compareRunsMode"] == "CHART"
    saved = json.loads(
        tracker.client.get_experiment(tracker.experiment_id).tags[view.TAG_PREFIX + params["viewStateShareKey"]]
    )
    assert saved["name"] == "sweep ead"
    state = json.loads(saved["state"])
    assert len(tracker.client.search_runs([tracker.experiment_id], state["searchFilter"])) == 2
    assert state["orderByKey"] == "metrics.`val/accuracy`" and state["orderByAsc"] is False
    assert [c["metricKey"] for c in state["compareRunCharts"]] == ["val/accuracy", "val/accuracy_se", "policy/entropy"]
    assert [s["display"] for s in state["compareRunSections"]] == [True, False, False, False, False]
    assert [s["name"] for s in state["compareRunSections"][1:]] == ["policy", "timing", "val", "System metrics"]
    assert state["groupBy"]["groupByKeys"] == [
        {"mode": "tag", "groupByData": "config"},
        {"mode": "tag", "groupByData": "stage"},
    ]
    assert state["selectedColumns"][:2] == ["metrics.`val/accuracy`", "params.`lr`"]
    assert state["runsHiddenMode"] == "SHOW_ALL"


def test_unflatten_nests_one_section_of_flattened_params_again():
    from orchestrator.tracking import flatten, unflatten

    spec = {"rollout": {"decoding": {"schedule": "ead", "ead": {"tau_max": 1.2, "d0": 25.0}}, "top_p": 0.9}, "seed": 3}
    assert unflatten(flatten(spec), "rollout.decoding.") == spec["rollout"]["decoding"]
    assert unflatten(flatten(spec), "learner.") == {}


def test_a_moved_store_points_at_its_new_folder_and_nothing_else(tmp_path):
    """Runs, the experiment and a registered model version follow the folder; an experiment given a folder
    of its own, and a store that never moved, are left alone."""
    import shutil

    from orchestrator.tracking import open_store, rebase

    old, new = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    tracker = Tracker(default_tracking_uri(str(old)), "rlvr-explore")
    run_id = tracker.client.create_run(tracker.experiment_id, tags={"run_path": f"{old}/t1"}).info.run_id
    (tmp_path / "note.txt").write_text("kept")
    tracker.client.log_artifact(run_id, str(tmp_path / "note.txt"))
    tracker.client.create_registered_model("m")
    tracker.client.create_model_version("m", f"{tracker.client.get_run(run_id).info.artifact_uri}/note.txt", run_id)
    other = tracker.client.create_experiment(
        "other", artifact_location=(tmp_path / "a" / "runs2" / "mlartifacts").as_uri()
    )
    assert rebase(old / "mlflow.db") == 0  # nothing moved
    shutil.move(old, new)

    client = open_store(default_tracking_uri(str(new)))
    root = (new / "mlartifacts").as_uri()
    assert client.get_run(run_id).info.artifact_uri.startswith(root + "/")
    assert client.get_experiment_by_name("rlvr-explore").artifact_location == root
    assert client.get_model_version("m", "1").source.startswith(root + "/")
    assert client.get_run(run_id).data.tags["run_path"] == f"{new}/t1"  # a --resume here finds the trial's run
    assert (
        client.download_artifacts(run_id, "note.txt", str(tmp_path)) and (tmp_path / "note.txt").read_text() == "kept"
    )
    # "other" was given a folder of its own (which shares the old root's prefix): it keeps it. A second
    # open changes nothing.
    assert client.get_experiment(other).artifact_location == (tmp_path / "a" / "runs2" / "mlartifacts").as_uri()
    assert rebase(new / "mlflow.db") == 0
