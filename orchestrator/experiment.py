"""What a sweep and a study share: a Ray Tune experiment whose trials are configurations, each trained
with R seeds (`orchestrator.seeds`), recorded in MLflow under one parent run, stoppable by SIGTERM and
resumable with `--resume`; and each configuration's summary (mean and 95% interval over its seeds).
"""

from __future__ import annotations

import math
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

from orchestrator.cli import ExperimentFailed
from orchestrator.console import console, short_params
from orchestrator.decisions import pooled_sd
from orchestrator.inputs import check_folder_path, check_name, check_tracking_uri
from orchestrator.lease import Lease, check_settings
from orchestrator.launch import check_shared_storage, init_ray, load_offline, logical_cpus, storage_uri
from orchestrator.preempt import STOPPED_EXIT_CODE, StopRequest
from orchestrator.scheduler import pruned_record
from orchestrator.seeds import HORIZON_KEY, SE_KEY, SeedGroup, ended, seed_configs, seed_name
from orchestrator.spec import SpecError
from orchestrator.stats import Interval, describe, paired_difference, seed_interval, seeds_needed, seeds_range, verdict
from orchestrator.tracking import Tracker, default_tracking_uri
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
    started: float = field(default_factory=time.perf_counter)


def start(kind: str, name: str, storage: str, base_cfg: TrialConfig, *, tracking_uri: str | None, spec: str,
          params: dict, resume: bool, force: bool = False, seeds: int, cpus_per_trial: int) -> Experiment:
    """Check the name is free (or resumable), open the parent MLflow run, start Ray, arm SIGTERM."""
    check_name(name, "name")
    check_folder_path(storage, "storage")
    if tracking_uri is not None:
        check_tracking_uri(tracking_uri, "--tracking-uri")
    if base_cfg.seed + seeds - 1 > SEED_MAX:
        raise SpecError(f"seed: {base_cfg.seed} with {seeds} seeds passes {SEED_MAX}, the largest seed")
    uri = f"{storage.rstrip('/')}/{name}" if "://" in storage else str(Path(storage_uri(storage)) / name)
    # The Optuna study and the summaries stay on a local disk when the experiment lives in a bucket.
    folder = Path(uri) if "://" not in storage else Path(".cache") / f"{kind}s" / name
    check_resumable(uri, name, resume)
    lease = Lease(uri)
    lease.acquire(f"{kind} {name!r} in {storage}")
    check_settings(uri, {"trial": base_cfg.model_dump(mode="json"), kind: params}, resume=resume, force=force)
    folder.mkdir(parents=True, exist_ok=True)
    if "://" in storage and resume:
        fetch_study(folder, uri)
    resolve_model_path(base_cfg.model, base_cfg.cache_dir)  # build once, here
    tracking_uri = tracking_uri or base_cfg.logging.tracking_uri
    if tracking_uri is None and "://" in storage:
        raise SpecError(f"--tracking-uri is needed with a storage URI ({storage}): an MLflow server such as "
                        f"http://HOST:5000 (the default sqlite store is a local file)")
    tracking_uri = tracking_uri or default_tracking_uri(storage)
    init_ray(cpus_per_trial)
    check_shared_storage(storage)
    tracker = Tracker(tracking_uri, base_cfg.logging.experiment)
    parent = tracker.start_sweep_run(name, spec_text=Path(spec).read_text(), search=params, resume=resume, kind=kind)
    stop = StopRequest(uri)
    stop.clear()
    exp = Experiment(name, uri, folder, tracking_uri, tracker, parent, stop, lease)
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


def cluster_cpus(base_cfg: TrialConfig, concurrent: int, seeds: int) -> int:
    return logical_cpus(base_cfg) * concurrent * seeds


def run_name(shown: dict[str, str], seed: int) -> str:
    """A seed run's name by what differs: `tau_max=1.25 d0=54 seed=1`, or `arm=ead seed=1`."""
    return " ".join([*(f"{k}={v}" for k, v in shown.items()), f"seed={seed}"])


def make_trainable(base: dict, exp: Experiment, metric: str, seeds: int, arms: dict[str, dict] | None = None):
    """The Tune trial: one configuration (the sampled fields, or a study's arm) trained with `seeds` seeds,
    each its own Ray Train run and nested MLflow run (param `seed`, tag `config`)."""
    tracking = {"uri": exp.tracking_uri, "parent_run_id": exp.parent, "sweep": exp.name}
    storage, stop = f"{exp.uri}/trials", exp.stop

    def trainable(sampled: dict[str, Any]) -> None:
        from ray import tune

        config_id = tune.get_context().get_trial_id()
        overrides = dict(arms[sampled["arm"]]) if arms is not None else dict(sampled)
        cfgs = seed_configs(base, overrides, config_id, storage, seeds)
        model_path = resolve_model_path(cfgs[0].model, cfgs[0].cache_dir)
        tracker = Tracker(tracking["uri"], cfgs[0].logging.experiment)
        shown = {"arm": sampled["arm"]} if arms is not None else short_params(sampled)
        tags = {"kind": "trial", "stage": "study" if arms is not None else "select", "sweep": tracking["sweep"], "trial_id": config_id, "config": config_id,
                **shown}
        run_ids = [tracker.start_trial_run(cfg, parent_run_id=tracking["parent_run_id"], resume=True,
                                           tags={**tags, "seed": str(cfg.seed)}, run_name=run_name(shown, cfg.seed))
                   for cfg in cfgs]
        store = load_offline(cfgs[0], model_path)  # the task's seed: the same teachers for every seed
        for run_id in run_ids:
            if store is not None:
                tracker.log_offline_store(run_id, store)
        group = SeedGroup(cfgs, metric, tune.report)
        results = group.run(model_path, [{"uri": tracking["uri"], "run_id": r} for r in run_ids], store, stop.uri)
        # Checkpointed for a resume: stay "running" so that Tune neither closes the trial nor starts
        # another in its place before the driver exits.
        hold_if_preempted(results, tracker, run_ids, stop, config_id)

    return trainable


def hold_if_preempted(results: list, tracker: Tracker, run_ids: list, stop, name: str) -> None:
    """When any seed checkpointed for a resume (SIGTERM): close its runs `stopped`, tell the driver
    (`stop.acknowledge(name)`), and wait here until the driver exits; otherwise return at once."""
    if any((r.metrics or {}).get("progress/preempted") for r in results):
        for run_id in run_ids:
            tracker.finish(run_id, "stopped")
        stop.acknowledge(name)
        while True:
            time.sleep(60)


class TrialStates(Callback):
    """Tune callback: closes each configuration's MLflow runs with its state (finished, pruned,
    errored), keeps `RUNNING` for the SIGTERM path, and prints one line when a configuration starts,
    is validated, and ends (Tune itself runs silent: its boxes hold ~60 metrics per report).

    A module-level class, so that the copy Tune pickles with the experiment (and a --resume restores)
    still updates this module's `RUNNING`.
    """

    def __init__(self, tracker: Tracker, sweep: str, seeds: list[int], metric: str,
                 study: tuple[Path, str] | None = None):
        self.tracker, self.sweep, self.seeds, self.metric = tracker, sweep, seeds, metric
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
            self._say(trial, f"step {result['progress/step']}/{result.get(HORIZON_KEY, '?')}: {self._objective(result)}")

    def _close(self, trial, state: str, description: str | None = None) -> None:
        from trainables.rollout.service import remove_engine_group

        RUNNING.discard(trial.trial_id)
        for seed in self.seeds:  # a pruned trial's actors are killed before their `finally` runs
            remove_engine_group(seed_name(trial.trial_id, seed))
        CLOSER.submit(self.tracker.finish_sweep_trial, self.sweep, trial.trial_id, state, description)
        if getattr(self, "study", None) is not None:  # (a callback restored from an older sweep has none)
            CLOSER.submit(save_study, *self.study)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        uri = self.study[1] if getattr(self, "study", None) else None
        state, pruned, _ = ended(result, uri, trial.trial_id,
                                 lambda config: self.tracker.config_seeds(self.sweep, config, self.metric))
        why = (pruned_record(uri, trial.trial_id) or (None, ""))[1] if state == "pruned" else ""
        self._close(trial, state, f"Pruned at step {pruned}: {why or 'the scheduler stopped it'}. Its metrics end "
                                  f"where it was judged." if state == "pruned" else None)
        said = {"finished": "finished", "pruned": f"pruned by the scheduler at step {pruned}",
                "errored": "ended short of its last step with no scheduler decision"}[state]
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
        raise SpecError(f"--name: {name!r} already exists in {uri}; pass --resume to continue it, or --name NEW "
                        f"for a new one")
    if resume:
        check_state_owner(f"{uri}/tune")


def check_state_owner(tune_folder: str, uid: int | None = None) -> None:
    """Ray Tune's saved state is pickled: restoring it runs whatever code it names. A local folder holding
    state another user wrote is refused; under a URI, where no owner can be read, the command says what it
    is about to unpickle."""
    if "://" in tune_folder:
        console.print(f"[yellow]--resume: restoring Ray Tune's pickled state from {tune_folder}: it runs the code it "
                      "names; resume only folders you or people you trust wrote[/yellow]", soft_wrap=True)
        return
    uid = os.getuid() if uid is None else uid
    foreign = sorted(p for p in Path(tune_folder).iterdir() if p.is_file() and p.stat().st_uid != uid)
    if foreign:
        raise SpecError(f"--resume: {tune_folder} holds Ray Tune's pickled state written by another user "
                        f"({foreign[0].name}, uid {foreign[0].stat().st_uid}); restoring it would run their code: "
                        "refused")


def stop_when_checkpointed(exp: Experiment) -> None:
    """SIGTERM: once every running trial has checkpointed (or after STOP_GRACE_S), exit for a resume."""
    console.print(f"SIGTERM: {len(RUNNING)} running trials checkpoint at their next step boundary, then "
                  f"{exp.name} stops")

    def wait_and_exit() -> None:
        deadline = time.time() + STOP_GRACE_S
        while not RUNNING <= exp.stop.acknowledged() and time.time() < deadline:
            time.sleep(1)
        missing = RUNNING - exp.stop.acknowledged()
        exp.tracker.finish(exp.parent, "stopped")
        exp.lease.release()  # os._exit skips atexit: a --resume right after must find the lease free
        console.print(f"stopped; {len(RUNNING) - len(missing)} trials checkpointed"
                      f"{f', {sorted(missing)} did not in time' if missing else ''}: rerun the same command "
                      f"with --resume to continue", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        os._exit(STOPPED_EXIT_CODE)  # the trials hold their slots until the driver (and its job) goes

    threading.Thread(target=wait_and_exit, daemon=True).start()


def fit(exp: Experiment, trainable, tune_config: Callable[[], Any], seeds: list[int], resume: bool,
        param_space: dict | None = None):
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
    if resume:  # the searcher (with its Optuna study), the scheduler and every trial come back as they were
        tuner = tune.Tuner.restore(f"{exp.uri}/tune", trainable, resume_unfinished=True, resume_errored=False)
    else:
        config = tune_config()
        states = TrialStates(exp.tracker, exp.name, seeds, config.metric, (exp.folder, exp.uri))
        # verbose=0: TrialStates prints a line per event, and each trial its steps.
        run_config = tune.RunConfig(name="tune", storage_path=exp.uri, verbose=0,
                                    callbacks=[states, CSVLoggerCallback(), JsonLoggerCallback()])
        tuner = tune.Tuner(trainable, tune_config=config, param_space=param_space, run_config=run_config)
    results = tuner.fit()
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


@dataclass
class ConfigSummary:
    """One configuration at its end: its settings, state, per-seed objective and interval."""

    config_id: str
    params: dict[str, Any]
    state: str
    steps: int
    values: list[float]  # the objective, seed by seed
    interval: Interval | None
    se: float | None  # the validation's own standard error (mean over seeds)
    metrics: dict[str, float]


def summarize(results, metric: str, keys: list[str], uri: str | None = None,
              seeds_of: Callable[[str], list] | None = None) -> list[ConfigSummary]:
    """Every configuration of a ResultGrid, in the order Tune made them. One that ended short of its last
    step is read from durable records (`seeds.outcome`): the scheduler's stops under `uri`, and
    `seeds_of(config_id)`, its seed runs' own (steps, learner.steps, objective), where Tune lost its last
    report."""
    out = []
    for r in results:
        m, config_id = dict(r.metrics or {}), trial_id_of(r)
        values = [m[k] for k in sorted((k for k in m if k.startswith("seeds/") and k.endswith(f"/{metric}")),
                                       key=lambda k: int(k.split("/")[1]))]
        steps, state = int(m.get("progress/step", 0)), "errored" if r.error else "finished"
        if not r.error:
            state, _, seeds = ended(m, uri, config_id, seeds_of)
            if seeds and state == "finished":
                values, steps = [v for _, _, v in seeds], seeds[0][1]
        se = m.get(SE_KEY)
        values = [v for v in values if v is not None]
        out.append(ConfigSummary(config_id, {k: r.config.get(k) for k in keys}, state, steps, values,
                                 seed_interval(values, se) if values else None, se, m))
    return out


def trial_id_of(result) -> str:
    """A Tune result's trial id: reported with every result, else from its folder (`trainable_<id>_<n>_...`)."""
    if (result.metrics or {}).get("trial_id"):
        return result.metrics["trial_id"]
    name = result.path.rstrip("/").rsplit("/", 1)[-1]
    return name.split("_")[1] if name.startswith("trainable_") else name


def log_config_metrics(exp: Experiment, summaries: list[ConfigSummary], metric: str) -> None:
    """Each configuration's mean and interval, on every one of its seed runs (MLflow groups them by `config`)."""
    for s in summaries:
        if s.interval is None:
            continue
        values = {f"config/{metric}/mean": s.interval.mean, f"config/{metric}/ci_low": s.interval.low,
                  f"config/{metric}/ci_high": s.interval.high}
        values = {k: v for k, v in values.items() if v == v}  # no interval without seeds or a standard error
        exp.tracker.log_config_metrics(exp.name, s.config_id, values)


@dataclass(frozen=True)
class Comparison:
    """A configuration against a reference over the same seeds: the paired difference, its verdict, and
    the seeds a verdict would need (None: not estimable)."""

    diff: Interval
    verdict: str
    seeds_needed: int | None
    span: tuple[int, int] | None = None  # seeds_needed at the ends of the effect's 95% interval

    def line(self, reference: str = "the baseline", label: str = "best - baseline") -> str:
        return describe(self.diff, self.verdict, self.seeds_needed, reference, label, self.span)


# Settings that change what the objective measures: the validation's problems, samples, decoding, length.
MEASUREMENT = ("validation.", "task.name", "task.levels", "task.val_size", "task.seed", "prompt.",
               "rollout.max_new_tokens")


def incomparable(a_params: dict[str, Any], b_params: dict[str, Any], a_steps, b_steps) -> str | None:
    """Why two sides' objectives cannot be paired (their values come from different steps, or from
    different validations), or None. Params: each side's overrides of the common spec."""
    if a_steps != b_steps:
        return f"their values come from different steps ({a_steps} and {b_steps})"
    differ = sorted(k for k in a_params.keys() | b_params.keys()
                    if k.startswith(MEASUREMENT) and a_params.get(k) != b_params.get(k))
    if differ:
        return f"they are measured by different validations ({', '.join(differ)})"
    return None


def compare(a: ConfigSummary, b: ConfigSummary, mode: str) -> Comparison | None:
    """a - b, seed by seed; None when either has no objective on every seed, or the two cannot be paired
    (`incomparable`: a configuration stopped early against one that ran on, or another validation)."""
    n = min(len(a.values), len(b.values))
    if not n or incomparable(a.params, b.params, a.steps, b.steps):
        return None
    se = math.sqrt(a.se**2 + b.se**2) if n == 1 and a.se is not None and b.se is not None else None
    diff = paired_difference(a.values[:n], b.values[:n], se)
    diffs = [x - y for x, y in zip(a.values[:n], b.values[:n])]
    seeds = diff.source == "seeds"
    return Comparison(diff, verdict(diff, mode), seeds_needed(diffs) if seeds else None,
                      seeds_range(diffs) if seeds else None)


def pooled_seed_sd(summaries: list[ConfigSummary]) -> float | None:
    """The seed-to-seed standard deviation of the objective, pooled over the configurations with >= 2
    seeds that reached the last step any reached (values of one step only)."""
    last = max((s.steps for s in summaries if s.values), default=0)
    sd, df = pooled_sd([s.values for s in summaries if s.steps == last])
    return sd if df else None


def noise_line(summaries: list[ConfigSummary], metric: str) -> str:
    """How much of the noise is measurement (the validation's standard error) and how much training (seeds)."""
    se = [s.se for s in summaries if s.se is not None]
    sd = pooled_seed_sd(summaries)
    parts = [f"validation standard error of {metric}: {sum(se) / len(se):.3f} (its problems and samples)" if se
             else f"no standard error reported for {metric}"]
    parts.append(f"seed-to-seed SD: {sd:.3f} (measurement and training together)" if sd is not None
                 else "one seed per configuration: the intervals ignore seed noise")
    return "; ".join(parts)


def markdown_table(summaries: list[ConfigSummary], metric: str, keys: list[str], names: dict[str, str] | None = None) -> str:
    """The configurations as a Markdown table: state, steps, mean and 95% interval, each seed's value."""
    header = ["configuration", "state", "steps", f"{metric} mean [95% CI]", "seeds", "val SE",
              *short_params(dict.fromkeys(keys, 0))]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        name = (names or {}).get(s.config_id, s.config_id)
        seeds = ", ".join(f"{v:.3f}" for v in s.values) or "-"
        lines.append("| " + " | ".join([name, s.state, str(s.steps), s.interval.format() if s.interval else "-", seeds,
                                        f"{s.se:.3f}" if s.se is not None else "-",
                                        *short_params({k: s.params.get(k) for k in keys}).values()]) + " |")
    return "\n".join(lines) + "\n"
