"""What a sweep and a study share: a Ray Tune experiment whose trials are configurations, each trained
with R seeds (the Tune trial: `orchestrator.seeds`), recorded in MLflow under one parent run,
stoppable by SIGTERM and resumable with `--resume`. What it concludes is `orchestrator.summary`'s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune import Callback

from orchestrator.console import console, short_params
from orchestrator.inputs import check_folder_path, check_name, check_tracking_uri
from orchestrator.launch import claim_folder, logical_cpus, run_folder, start_cluster
from orchestrator.lease import Lease
from orchestrator.pool import close_pool, release_runs, start_pool
from orchestrator.preempt import STOPPED_EXIT_CODE, StopRequest
from orchestrator.scheduler import pruned_record
from orchestrator.seeds import HORIZON_KEY, ended, run_names
from orchestrator.spec import SpecError
from orchestrator.tracking import Tracker, default_tracking_uri
from orchestrator.tune_state import Sealer, put_back, verified_copy
from trainables.config import SEED_MAX, VAL_STEP, TrialConfig
from trainables.data.models import resolve_model_path

STOP_GRACE_S = 600  # longest wait for running trials to checkpoint after SIGTERM
STUDY_FILE = "optuna.db"
HEAD_NODE = "node:__internal_head__"  # a resource only Ray's head node has (Ray Train pins its state actor so)
RUNNING: set[str] = set()  # ids of the trials running now (kept by the TrialStates callback)
STARTED: list[Experiment] = []  # experiments this command started: closed in MLflow on any way out
# Closing a trial's MLflow runs, off Tune's loop: a slow or dead tracking server (up to ~30 s of retries a
# call) never holds up the other trials; one thread keeps the closes in order, `closed()` waits for them.
CLOSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-close")


def closed() -> None:
    CLOSER.submit(lambda: None).result()


def close_pools() -> None:
    """The rollout pools of the experiments this process started: stopped, with every set they kept."""
    for exp in STARTED:
        if exp.pool is not None:
            close_pool(exp.pool)
            exp.pool = None


@dataclass
class Experiment:
    """Where an experiment (sweep or study) lives and records: its folder, MLflow run and stop file."""

    name: str
    uri: str  # <storage>/<name>, a folder or a bucket URI
    folder: Path  # local: Optuna's study, best_trial.yaml, study.json (the same as `uri` when local)
    tracking_uri: str
    tracker: Tracker
    parent: str | None
    stop: StopRequest
    lease: Lease
    trust_unsealed: bool = False  # --trust-unsealed: its trials resume from checkpoints sealed elsewhere
    sealed: Path | None = None  # --resume: the sealed copy of Tune's state it resumes from (tune_state.py)
    pool: Any = None  # its rollout pool (orchestrator/pool.py): engines and verifiers kept from run to run
    started: float = field(default_factory=time.perf_counter)


def start(
    kind: str,
    name: str,
    storage: str,
    base_cfg: TrialConfig,
    *,
    tracking_uri: str | None,
    spec: str,
    params: dict,
    resume: bool,
    force: bool = False,
    trust_unsealed: bool = False,
    seeds: int,
    cpus_per_trial: int,
) -> Experiment:
    """Check the name is free (or resumable), open the parent MLflow run, start Ray, arm SIGTERM."""
    check_name(name, "name")
    check_folder_path(storage, "storage")
    if tracking_uri is not None:
        check_tracking_uri(tracking_uri, "--tracking-uri")
    if base_cfg.seed + seeds - 1 > SEED_MAX:
        raise SpecError(f"seed: {base_cfg.seed} with {seeds} seeds passes {SEED_MAX}, the largest seed")
    uri = run_folder(storage, name)
    # The Optuna study and the summaries stay on a local disk when the experiment lives in a bucket.
    folder = Path(uri) if "://" not in storage else Path(".cache") / f"{kind}s" / name
    tracking_uri = tracking_uri or base_cfg.logging.tracking_uri
    if tracking_uri is None and "://" in storage:
        raise SpecError(
            f"--tracking-uri is needed with a storage URI ({storage}): an MLflow server such as "
            f"http://HOST:5000 (the default sqlite store is a local file)"
        )
    tracking_uri = tracking_uri or default_tracking_uri(storage)
    check_resumable(uri, name, resume)
    lease = claim_folder(
        f"{kind} {name!r} in {storage}",
        storage,
        name,
        {"trial": base_cfg.model_dump(mode="json"), kind: params},
        resume=resume,
        force=force,
    )
    # Only bytes this product sealed are unpickled (orchestrator/tune_state.py); the lease is held: no driver writes.
    sealed = verified_copy(Path(uri) / "tune", trust_unsealed) if resume and "://" not in storage else None
    folder.mkdir(parents=True, exist_ok=True)
    if "://" in storage and resume:
        fetch_study(folder, uri)
    resolve_model_path(base_cfg.model, base_cfg.cache_dir)  # build once, here
    tracker, stop = start_cluster(
        storage, name, cpus=cpus_per_trial, tracking_uri=tracking_uri, experiment=base_cfg.logging.experiment
    )
    parent = tracker.start_sweep_run(name, spec_text=Path(spec).read_text(), search=params, resume=resume, kind=kind)
    exp = Experiment(
        name, uri, folder, tracking_uri, tracker, parent, stop, lease, trust_unsealed, sealed, pool=start_pool()
    )
    STARTED.append(exp)
    stop.on_sigterm(lambda: stop_when_checkpointed(exp))
    return exp


def save_study(folder: Path, uri: str) -> None:
    """With a bucket storage, a copy of the Optuna study (kept on a local disk: sqlite) beside the
    experiment in the bucket, for a --resume from another machine. sqlite's backup API copies a
    consistent snapshot while Optuna may be writing."""
    import sqlite3
    import tempfile

    import pyarrow.fs

    if "://" not in uri or not (folder / STUDY_FILE).exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        with sqlite3.connect(folder / STUDY_FILE) as source, sqlite3.connect(Path(tmp) / STUDY_FILE) as copy:
            source.backup(copy)
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        fs.create_dir(path, recursive=True)
        pyarrow.fs.copy_files(str(Path(tmp) / STUDY_FILE), f"{path}/{STUDY_FILE}", destination_filesystem=fs)


def fetch_study(folder: Path, uri: str) -> None:
    """A --resume on a machine without the study: its copy from the bucket, if there is one."""
    import pyarrow.fs

    if not (folder / STUDY_FILE).exists():
        try:
            pyarrow.fs.copy_files(f"{uri}/{STUDY_FILE}", str(folder / STUDY_FILE))
        except FileNotFoundError:
            pass


def given(flag: str | None, default: str) -> str:
    """A flag's value when it was given (even empty, which the checks then refuse), else the spec's."""
    return default if flag is None else flag


def cluster_cpus(base_cfg: TrialConfig, runs: int) -> int:
    """A local cluster's CPUs for `runs` Ray Train runs at once (orchestrator/seeds.py: runs_at_once)."""
    return logical_cpus(base_cfg) * runs


class TrialStates(Callback):
    """Tune callback: closes each configuration's MLflow runs with its state (finished, pruned,
    errored), keeps `RUNNING` for the SIGTERM path, and prints one line when a configuration starts,
    is validated, and ends (Tune itself runs silent: its boxes hold ~60 metrics per report).

    A module-level class, so that the copy Tune pickles with the experiment (and a --resume restores)
    still updates this module's `RUNNING`.
    """

    def __init__(
        self,
        tracker: Tracker,
        sweep: str,
        seeds: list[int],
        metric: str,
        study: tuple[Path, str] | None = None,
        parts: int = 1,
    ):
        self.tracker, self.sweep, self.seeds, self.metric, self.parts = tracker, sweep, seeds, metric, parts
        self.study = study  # (local folder, bucket URI): the Optuna study copied after every trial

    def _say(self, trial, what: str) -> None:
        console.print(f"[bold]{trial.trial_id}[/bold] {what}", highlight=False, soft_wrap=True)

    def _objective(self, result: dict) -> str:
        if self.metric not in result:
            return ""
        low, high = result.get(f"{self.metric}/ci_low"), result.get(f"{self.metric}/ci_high")
        band = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        return f"{self.metric} {result[self.metric]:.3f}{band}"

    def on_trial_start(self, iteration, trials, trial, **info):
        RUNNING.add(trial.trial_id)
        shown = " ".join(f"{k}={v}" for k, v in short_params(trial.config).items())
        self._say(trial, f"started: {shown} x {len(self.seeds)} seed(s)")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get(VAL_STEP) == result.get("progress/step"):  # a validation step
            self._say(
                trial, f"step {result['progress/step']}/{result.get(HORIZON_KEY, '?')}: {self._objective(result)}"
            )

    def _close(self, trial, state: str, description: str | None = None) -> None:
        RUNNING.discard(trial.trial_id)
        # A pruned trial's actors are killed before their `finally` runs: its runs' engines are released here.
        release_runs(run_names(trial.trial_id, self.seeds, getattr(self, "parts", 1)))
        CLOSER.submit(self.tracker.finish_sweep_trial, self.sweep, trial.trial_id, state, description)
        if getattr(self, "study", None) is not None:  # (a callback restored from an older sweep has none)
            CLOSER.submit(save_study, *self.study)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        uri = self.study[1] if getattr(self, "study", None) else None
        state, pruned, _ = ended(
            result, uri, trial.trial_id, lambda config: self.tracker.config_seeds(self.sweep, config, self.metric)
        )
        why = (pruned_record(uri, trial.trial_id) or (None, ""))[1] if state == "pruned" else ""
        self._close(
            trial,
            state,
            f"Pruned at step {pruned}: {why or 'the scheduler stopped it'}. Its metrics end where it was judged."
            if state == "pruned"
            else None,
        )
        said = {
            "finished": "finished",
            "pruned": f"pruned by the scheduler at step {pruned}",
            "errored": "ended short of its last step with no scheduler decision",
        }[state]
        objective = self._objective(result)
        self._say(trial, f"{said}: {objective}" if objective else said)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._close(trial, "errored")
        self._say(trial, f"errored: {trial.error_file or 'see ' + str(trial.local_path)}")


def check_resumable(uri: str, name: str, resume: bool) -> None:
    from ray import tune

    exists = tune.Tuner.can_restore(f"{uri}/tune")
    if resume and not exists:
        raise SpecError(f"--resume: nothing named {name!r} to resume in {uri}")
    if exists and not resume:
        raise SpecError(
            f"--name: {name!r} already exists in {uri}; pass --resume to continue it, or --name NEW for a new one"
        )
    if resume:
        check_state_owner(f"{uri}/tune")


def check_state_owner(tune_folder: str, uid: int | None = None) -> None:
    """Ray Tune's saved state is pickled: restoring it runs whatever code it names. A local folder holding
    state another user wrote is refused; under a URI, where no owner can be read, the command says what it
    is about to unpickle."""
    if "://" in tune_folder:
        console.print(
            f"[yellow]--resume: restoring Ray Tune's pickled state from {tune_folder}: it runs the code it "
            "names; resume only folders you or people you trust wrote[/yellow]",
            soft_wrap=True,
        )
        return
    uid = os.getuid() if uid is None else uid
    foreign = sorted(p for p in Path(tune_folder).iterdir() if p.is_file() and p.stat().st_uid != uid)
    if foreign:
        raise SpecError(
            f"--resume: {tune_folder} holds Ray Tune's pickled state written by another user "
            f"({foreign[0].name}, uid {foreign[0].stat().st_uid}); restoring it would run their code: "
            "refused"
        )


def stop_when_checkpointed(exp: Experiment) -> None:
    """SIGTERM: once every running trial has checkpointed (or after STOP_GRACE_S), exit for a resume."""
    console.print(
        f"SIGTERM: {len(RUNNING)} running trials checkpoint at their next step boundary, then {exp.name} stops"
    )

    def wait_and_exit() -> None:
        deadline = time.time() + STOP_GRACE_S
        while not RUNNING <= exp.stop.acknowledged() and time.time() < deadline:
            time.sleep(1)
        missing = RUNNING - exp.stop.acknowledged()
        exp.tracker.finish(exp.parent, "stopped")
        exp.lease.release()  # os._exit skips atexit: a --resume right after must find the lease free
        console.print(
            f"stopped; {len(RUNNING) - len(missing)} trials checkpointed"
            f"{f', {sorted(missing)} did not in time' if missing else ''}: rerun the same command "
            f"with --resume to continue",
            highlight=False,
            soft_wrap=True,
        )
        sys.stdout.flush()
        os._exit(STOPPED_EXIT_CODE)  # the trials hold their slots until the driver (and its job) goes

    threading.Thread(target=wait_and_exit, daemon=True).start()


def fit(
    exp: Experiment,
    trainable,
    tune_config: Callable[[], Any],
    seeds: list[int],
    resume: bool,
    parts: int,
    param_space: dict | None = None,
):
    """Run (or with `resume` continue) the Tune experiment; its ResultGrid.

    `tune_config` is called only for a new experiment: a searcher built on resume would enqueue its
    points_to_evaluate in the Optuna study a second time, and the restored searcher would propose them again.
    """
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    # Tune saves its state (trials, searcher, scheduler) at most this often: what a killed driver loses.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    # Results as JSON and CSV (what ExperimentAnalysis reads), without TensorBoard files in Ray's temp folder.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Tune's own reporter, which at verbose=0 is silent (the newer one still draws its banner box).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # A trial's driver (and with it its Ray Train controller, which follows its driver's node) lives on the
    # head: a spot node taken away takes learner ranks and engines, which come back, never a trial's
    # driver. It reserves no CPU (a cluster's head often has none to give); Train workers reserve their own.
    trainable = tune.with_resources(trainable, {"CPU": 0, HEAD_NODE: 0.001})
    tune_folder = Path(exp.uri) / "tune"
    if resume:  # the searcher (with its Optuna study), the scheduler and every trial come back as they were
        if exp.sealed is not None:
            put_back(tune_folder, exp.sealed)
        tuner = tune.Tuner.restore(f"{exp.uri}/tune", trainable, resume_unfinished=True, resume_errored=False)
    else:
        config = tune_config()
        states = TrialStates(exp.tracker, exp.name, seeds, config.metric, (exp.folder, exp.uri), parts)
        # verbose=0: TrialStates prints a line per event, and each trial its steps.
        run_config = tune.RunConfig(
            name="tune", storage_path=exp.uri, verbose=0, callbacks=[states, CSVLoggerCallback(), JsonLoggerCallback()]
        )
        tuner = tune.Tuner(trainable, tune_config=config, param_space=param_space, run_config=run_config)
    sealer = Sealer(tune_folder).start() if "://" not in exp.uri else None
    try:
        results = tuner.fit()
    finally:
        if sealer is not None:
            sealer.close()  # after Tune's last save
    closed()  # every trial's runs closed before the report reads them
    save_study(exp.folder, exp.uri)
    return results


def write_report(exp: Experiment) -> None:
    """The experiment's report (report.html with its plots inline, report.md, the PNGs) under its folder and
    in its parent run, timed as `sweep/report_s` beside `sweep/wall_s`. Under a storage URI the folder
    here holds no run: `orchestrator.report` renders it from a local copy."""
    if "://" in exp.uri:
        console.print(f"report: python -m orchestrator.report <a local copy of {exp.uri}>", soft_wrap=True)
        return
    from orchestrator import report

    start = time.perf_counter()
    report.run(str(exp.folder), None, exp.tracking_uri, exp.tracker.experiment)
    if exp.parent is not None:
        exp.tracker.log_metrics(exp.parent, {"sweep/report_s": time.perf_counter() - start})


def log_config_metrics(exp: Experiment, summaries: list, metric: str) -> None:
    """Each configuration's mean and interval, on every one of its seed runs (MLflow groups them by `config`)."""
    for s in summaries:
        if s.interval is None:
            continue
        values = {
            f"config/{metric}/mean": s.interval.mean,
            f"config/{metric}/ci_low": s.interval.low,
            f"config/{metric}/ci_high": s.interval.high,
        }
        values = {k: v for k, v in values.items() if v == v}  # no interval without seeds or a standard error
        exp.tracker.log_config_metrics(exp.name, s.config_id, values)
