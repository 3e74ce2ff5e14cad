"""Per-step metrics and small artifacts from rank 0 into the trial's MLflow run, never fatal to it.

Ray Train keeps only what `ray.train.report` sends, and reporting is a barrier worth ~seconds, so
the full per-step history goes straight to MLflow from rank 0. A tracking server that is down makes
the logger buffer and retry at the next step, and say so once; the trial goes on.

A resumed trial recomputes the steps since its checkpoint; their metrics are already in the run,
so the logger drops steps up to `skip_through` and the history has each step exactly once.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

MAX_BUFFERED_METRICS = 500_000  # ~10k steps of ~50 metrics; the oldest go first beyond it


class StepLogger:
    def __init__(self, tracking_uri: str | None, run_id: str | None):
        self.run_id = run_id
        self.client = None
        if tracking_uri and run_id:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri)
        self.pending: list = []
        self.pending_files: dict[str, bytes] = {}  # artifact path -> content; a rewrite replaces it
        self.failing_since: float | None = None
        self.skip_through = -1

    def logged_through(self, keys: tuple[str, ...]) -> int:
        """The last MLflow step at which any of `keys` is already in the run (-1: none, or no run)."""
        if self.client is None:
            return -1
        try:
            return max((m.step for key in keys for m in self.client.get_metric_history(self.run_id, key)), default=-1)
        except Exception as e:  # noqa: BLE001 - an unreachable store: nothing to skip
            log.warning("could not read the run's metric history (%s); recomputed steps may be logged twice", e)
            return -1

    def log(self, step: int, metrics: dict[str, float], *, force: bool = False) -> None:
        """Metrics of an MLflow step; steps up to `skip_through` are dropped unless `force`."""
        if self.client is None or (step <= self.skip_through and not force):
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.flush()

    def log_file(self, artifact_path: str, content: str | bytes) -> None:
        """An artifact of the run (rollout samples, the validation curve), sent with the next flush."""
        if self.client is None:
            return
        self.pending_files[artifact_path] = content.encode() if isinstance(content, str) else content
        self.flush()

    def flush(self) -> None:
        if self.client is None or not (self.pending or self.pending_files):
            return
        try:
            for i in range(0, len(self.pending), 1000):  # MLflow's batch limit
                self.client.log_batch(self.run_id, metrics=self.pending[i : i + 1000])
            self.pending = []
            for path in list(self.pending_files):
                self._upload(path, self.pending_files[path])
                del self.pending_files[path]
        except Exception as e:  # noqa: BLE001 - any tracking failure must not stop training
            if self.failing_since is None:
                self.failing_since = time.time()
                log.warning("MLflow logging failed (%s); buffering metrics and retrying each step", e)
            self.pending = self.pending[-MAX_BUFFERED_METRICS:]
            return
        if self.failing_since is not None:
            log.warning("MLflow logging recovered after %.0f s", time.time() - self.failing_since)
            self.failing_since = None

    def _upload(self, artifact_path: str, content: bytes) -> None:
        folder, name = str(Path(artifact_path).parent), Path(artifact_path).name
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_bytes(content)
            self.client.log_artifact(self.run_id, str(Path(tmp) / name), None if folder == "." else folder)
