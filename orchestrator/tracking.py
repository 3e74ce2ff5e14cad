"""MLflow records: a sqlite store inside the run's storage folder unless a tracking URI is given."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from trainables.config import TrialConfig

MAX_PARAM_LENGTH = 6000  # MLflow's limit on a parameter value


def default_tracking_uri(storage: str) -> str:
    folder = Path(storage).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Tracker:
    """Creates and closes runs; the trial's rank 0 logs the per-step metrics into them."""

    def __init__(self, tracking_uri: str, experiment: str):
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    def start_trial_run(self, cfg: TrialConfig, *, parent_run_id: str | None = None,
                        tags: dict[str, str] | None = None) -> str:
        all_tags = {"algorithm": cfg.algorithm.name, "git_commit": git_commit(), "state": "running",
                    **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=cfg.name, tags=all_tags)
        run_id = run.info.run_id
        params = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in flatten(cfg.model_dump(mode="json")).items()]
        for i in range(0, len(params), 100):  # MLflow's per-batch parameter limit
            self.client.log_batch(run_id, params=params[i : i + 100])
        self.client.log_text(run_id, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
                             "spec.yaml")
        return run_id

    def start_sweep_run(self, name: str, *, spec_text: str, search: dict[str, Any]) -> str:
        """The sweep's parent run: its spec, search space and commit; trials nest under it."""
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={"kind": "sweep", "sweep": name, "git_commit": git_commit(),
                                           "state": "running"})
        params = [Param(f"search.{k}", str(v)[:MAX_PARAM_LENGTH]) for k, v in flatten(search).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[i : i + 100])
        self.client.log_text(run.info.run_id, spec_text, "sweep_spec.yaml")
        return run.info.run_id

    def finish_sweep(self, run_id: str, best: dict[str, Any]) -> None:
        self.client.set_tag(run_id, "best_trial", str(best["trial_id"]))
        if best["metric"] is not None:
            self.client.log_metric(run_id, "best/objective", float(best["metric"]))
        self.client.log_batch(run_id, params=[Param(f"best.{k}", str(v)) for k, v in best["params"].items()])
        self.client.log_text(run_id, yaml.safe_dump(best, sort_keys=False), "best_trial.yaml")
        self.finish(run_id, "finished")

    def log_offline_store(self, run_id: str, store) -> None:
        """What the OGER paper's Table 1 reports, per teacher: as metrics and as a table artifact."""
        metrics = [Metric(k, float(v), int(time.time() * 1000), 0) for k, v in store.metrics().items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i : i + 1000])
        self.client.log_text(run_id, store.format_table(), "offline_store.txt")

    def finish(self, run_id: str, state: str) -> None:
        self.client.set_tag(run_id, "state", state)
        status = RunStatus.FINISHED if state == "finished" else RunStatus.FAILED
        self.client.set_terminated(run_id, RunStatus.to_string(status))

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
