"""Per-step metrics and small artifacts from rank 0 into the trial's MLflow run, never fatal to it.

Ray Train keeps only what `ray.train.report` sends, and reporting is a barrier worth ~seconds, so
the full per-step history goes straight to MLflow from rank 0, sent by a background thread: the
step does not wait for the store (~20 ms a step with sqlite). A tracking server that is down makes
the logger buffer and retry at the next step, and say so once; the trial goes on. `drain()` waits
until everything queued is sent (or buffered after a failure): before a checkpoint, so a resume
never skips a step that was only queued, and at the end.

A resumed trial recomputes the steps since its checkpoint; their metrics are already in the run,
so the logger drops steps up to `skip_through` and the history has each step exactly once.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
        self.lock = threading.Lock()  # guards pending and pending_files between the caller and the sender
        self.pending: list = []
        self.pending_files: dict[str, bytes] = {}  # artifact path -> content; a rewrite replaces it
        self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-log")  # one: in order
        self.flush_queued = False  # at most one flush waits behind the running one: a dead server is
        # tried once per step, not once per queued call
        self.failing_since: float | None = None
        self.skip_through = -1
        self.seconds = 0.0  # the caller's time spent logging (queueing, draining), cumulative: timing/logging

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
        """Queue the metrics of an MLflow step; steps up to `skip_through` are dropped unless `force`."""
        if self.client is None or (step <= self.skip_through and not force):
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self.caller_time():
            with self.lock:
                self.pending += [Metric(k, float(v), now, step) for k, v in metrics.items()]
            self.queue_flush()

    def log_file(self, artifact_path: str, content: str | bytes) -> None:
        """Queue an artifact of the run (rollout samples, the validation curve)."""
        if self.client is None:
            return
        with self.caller_time():
            with self.lock:
                self.pending_files[artifact_path] = content.encode() if isinstance(content, str) else content
            self.queue_flush()

    def queue_flush(self) -> None:
        with self.lock:
            if self.flush_queued:
                return
            self.flush_queued = True
        self.sender.submit(self.flush)

    def drain(self) -> None:
        """Wait for every queued send to finish (what failed stays buffered for the next one)."""
        with self.caller_time():
            self.sender.submit(lambda: None).result()

    @contextmanager
    def caller_time(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def close(self) -> None:
        self.drain()
        self.sender.shutdown()

    def flush(self) -> None:
        """Send what is buffered (on the sender thread); on failure keep it for the next call."""
        with self.lock:
            metrics, files = self.pending, self.pending_files
            self.pending, self.pending_files, self.flush_queued = [], {}, False
        if self.client is None or not (metrics or files):
            return
        try:
            while metrics:
                self.client.log_batch(self.run_id, metrics=metrics[:1000])  # MLflow's batch limit
                metrics = metrics[1000:]
            for path in list(files):
                self._upload(path, files[path])
                del files[path]
        except Exception as e:  # noqa: BLE001 - any tracking failure must not stop training
            if self.failing_since is None:
                self.failing_since = time.time()
                log.warning("MLflow logging failed (%s); buffering metrics and retrying each step", e)
            with self.lock:  # back in front of what was queued meanwhile; a newer file version wins
                self.pending = (metrics + self.pending)[-MAX_BUFFERED_METRICS:]
                self.pending_files = {**files, **self.pending_files}
            return
        if self.failing_since is not None:
            log.warning("MLflow logging recovered after %.0f s", time.time() - self.failing_since)
            self.failing_since = None

    def _upload(self, artifact_path: str, content: bytes) -> None:
        folder, name = str(Path(artifact_path).parent), Path(artifact_path).name
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_bytes(content)
            self.client.log_artifact(self.run_id, str(Path(tmp) / name), None if folder == "." else folder)
