"""What the fault tests share: a short trial that checkpoints often, the metric history a faulted run
must reproduce bit for bit, watchers that strike when a trial has reached a step, and the check of a
confirmation's records after its faults."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.spec import load_trial_spec
from orchestrator.tracking import default_tracking_uri

EVERY = 2
# 16 prompts a step (the spec has 8): steps of ~1.3 s here, so a signal sent once step 3 is logged reaches the
# trial before step 4's stop check; at 0.65 s a step it sometimes did not, and the trial ran to its end.
# Two learner ranks (the spec has one): a rank lost mid-trial, and checkpoints written by both.
TRIAL = [
    "learner.steps=5",
    f"checkpoint.every={EVERY}",
    "validation.every=2",
    "validation.num_prompts=16",
    "validation.samples=2",
    "learner.prompts_per_step=16",
    "learner.num_workers=2",
]
# Wall-clock figures, the record of the faults themselves, and a sweep's summary over a configuration's seeds.
NOT_COMPARED = ("timing/", "faults/", "config/")


def trial_cfg(storage: Path, *overrides: str):
    return load_trial_spec("search_spaces/ead.yaml", [f"storage={storage}", *TRIAL, *overrides])


_REFERENCE: dict[str, list[tuple[int, float]]] = {}


def reference_history(tmp_path_factory) -> dict[str, list[tuple[int, float]]]:
    """The uninterrupted trial's compared history, run once a session on whichever cluster is up first
    (the multi-node one or the suite's): where its ranks and engine sit changes no number."""
    if not _REFERENCE:
        from orchestrator import train

        storage = tmp_path_factory.mktemp("reference")
        train.run(trial_cfg(storage))
        _REFERENCE.update(history(storage))
    return _REFERENCE


def runs(storage: Path, kind: str = "trial") -> list:
    client = MlflowClient(default_tracking_uri(str(storage)))
    experiment = client.get_experiment_by_name("rlvr-explore")
    return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("kind") == kind]


def history(storage: Path, run=None) -> dict[str, list[tuple[int, float]]]:
    """The compared metric history of the storage's only trial run (or of `run`)."""
    if run is None:
        (run,) = runs(storage)  # one MLflow run per trial, however often it was resumed
    client = MlflowClient(default_tracking_uri(str(storage)))
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
        if not key.startswith(NOT_COMPARED)
    }


def fault_metrics(storage: Path, run=None) -> dict[str, list[float]]:
    if run is None:
        (run,) = runs(storage)
    client = MlflowClient(default_tracking_uri(str(storage)))
    return {
        key: [m.value for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
        if key.startswith("faults/")
    }


def logged_steps(storage: Path, stage: str | None = None) -> list[int]:
    """RL steps logged so far by each trial run in the storage (of `stage`: select, confirm), oldest run
    first ([] before any)."""
    try:
        client = MlflowClient(default_tracking_uri(str(storage)))
        return [
            max((int(m.value) for m in client.get_metric_history(run.info.run_id, "progress/step")), default=0)
            for run in sorted(runs(storage), key=lambda r: r.info.start_time)
            if stage is None or run.data.tags.get("stage") == stage
        ]
    except Exception:  # noqa: BLE001 - the store is still being created
        return []


def logged_step(storage: Path) -> int:
    return max(logged_steps(storage), default=0)


def when(ready, action) -> threading.Thread:
    """Run `action()` in a thread as soon as `ready()` holds."""

    def watch():
        deadline = time.time() + 600
        while not ready() and time.time() < deadline:
            time.sleep(0.2)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def when_step(storage: Path, step: int, action) -> threading.Thread:
    """Run `action()` as soon as the trial in `storage` has logged `step` RL steps and Ray Train has
    committed a checkpoint (it does so at its next poll of the workers, within ~2 s of the save)."""
    return when(lambda: logged_step(storage) >= step and committed(storage) >= [1], action)


def committed(storage: Path) -> list[int]:
    """Checkpoints committed by each Train run under `storage`, in descending order."""
    counts = [
        len(json.loads(p.read_text())["checkpoint_results"]) for p in storage.rglob("checkpoint_manager_snapshot.json")
    ]
    return sorted(counts, reverse=True)


def finished_runs(storage: Path, steps: int) -> int:
    """Train runs under `storage` whose latest committed checkpoint is of their last step `steps`."""

    def last(path: Path) -> float:
        latest = json.loads(path.read_text()).get("latest_checkpoint_result") or {}
        return latest.get("metrics", {}).get("progress/step", 0)

    return sum(last(p) >= steps for p in storage.rglob("checkpoint_manager_snapshot.json"))


def sigkill_actor(class_name: str, sig: int = signal.SIGKILL) -> None:
    """Send `sig` (default: SIGKILL) to the process of a live actor of that class."""
    from ray.util.state import list_actors

    (actor, *_) = list_actors(filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")])
    os.kill(actor.pid, sig)


def driver_env(ray_cluster) -> dict[str, str]:
    """A CLI driver joins the tests' cluster, as a driver joins a real cluster (RAY_ADDRESS)."""
    return {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}


SWEEP = """
search:
  metric: val/accuracy
  mode: max
  num_samples: 3
  max_concurrent_trials: 1
  seed: 0
  scheduler: {name: none}
  points_to_evaluate: [{rollout.decoding.ead.tau_max: 1.0}, {rollout.decoding.ead.tau_max: 1.2}]
  space:
    rollout.decoding.ead.tau_max: {uniform: [0.8, 1.6]}
"""


def sweep_spec(folder: Path) -> Path:
    """The default spec's trial with SWEEP as its search: two given points, then Optuna's proposals."""
    import textwrap

    import yaml

    base = yaml.safe_load(open("search_spaces/ead.yaml"))
    base.pop("search")
    spec = folder / "sweep.yaml"
    spec.write_text(yaml.safe_dump(base) + textwrap.dedent(SWEEP))
    return spec


def check_confirmation_records(storage, out: str) -> None:
    """One MLflow run per (configuration, fresh seed), each run to its end once; the parent's verdict and
    interval are those recomputed from the runs' own final values; the report is whole, on disk and in
    the parent run."""
    from orchestrator.decisions import confirm_step

    (parent,) = runs(storage, "sweep")
    confirm = [r for r in runs(storage) if r.data.tags["stage"] == "confirm"]
    challenger, baseline = parent.data.tags["verdict_config"], parent.data.tags["baseline"]
    assert sorted((r.data.tags["config"], r.data.params["seed"]) for r in confirm) == sorted(
        (c, s) for c in (challenger, baseline) for s in ("1", "2")
    )
    for run in confirm:
        assert run.data.tags["state"] == "finished"
        assert [s for s, _ in history(storage, run)["progress/step"]] == [1, 2, 3, 4, 5]
    final = {(r.data.tags["config"], r.data.params["seed"]): r.data.metrics["val/accuracy"] for r in confirm}
    diffs = [final[challenger, s] - final[baseline, s] for s in ("1", "2")]
    look = confirm_step(diffs, [2], 0.05, None, "max")
    metrics = parent.data.metrics
    assert (
        metrics["confirm/best_minus_baseline/mean"],
        metrics["confirm/best_minus_baseline/ci_low"],
        metrics["confirm/best_minus_baseline/ci_high"],
    ) == pytest.approx((look.mean, look.low, look.high), abs=1e-12)
    assert parent.data.tags["verdict"] == look.verdict and parent.data.tags["verdict_stage"] == "confirm"
    html = (storage / "s" / "report" / "report.html").read_text()
    assert html.rstrip().endswith("</html>") and "report: " in out
    client = MlflowClient(default_tracking_uri(str(storage)))
    assert "report/report.html" in {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
