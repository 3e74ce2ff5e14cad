"""python -m orchestrator.sweep SPEC.yaml [--name N] [--storage PATH_OR_URI] [--num-samples K]
[--max-concurrent C] [--set key.path=value ...] [--tracking-uri URI] [--dry-run] [--resume]

A Ray Tune experiment over the spec's `search:` space: Optuna's TPE proposes trial settings (its
study in sqlite beside the sweep, so its history outlives the driver), ASHA stops weak trials early,
each trial is one Ray Train run of the RL loop with its own rollout service, and MLflow records one
parent run for the sweep and one nested run per trial.

`--resume` (same spec, name and storage) continues a sweep whose driver died or was stopped:
finished and errored trials stay as they are, every unfinished one continues from its latest
checkpoint in its own MLflow run, and the Optuna study, the searcher and ASHA go on where they
were. SIGTERM makes every running trial checkpoint at its next step boundary; the driver then
exits with 75, ready for `--resume`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from ray.tune import Callback
from rich.console import Console
from rich.table import Table

from orchestrator.preempt import STOPPED_EXIT_CODE, StopRequest
from orchestrator.spec import SearchConfig, SpecError, apply_overrides, derived_numbers, load_sweep_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from orchestrator.launch import fit_trial, init_ray, load_offline, logical_cpus, storage_uri
from trainables.config import TrialConfig
from trainables.data.bootstrap import resolve_model_path

console = Console()
BEST_SPEC = "best_trial.yaml"
STOP_GRACE_S = 600  # longest wait for running trials to checkpoint after SIGTERM
RUNNING: set[str] = set()  # ids of the trials running now (kept by the TrialStates callback)


class SweepFailed(RuntimeError):
    """Every trial failed: said in one line, with where the trials' errors are."""


def optuna_space(search: SearchConfig) -> tuple[dict, dict[str, Any]]:
    """(Optuna distributions of the searched fields, the fixed ones)."""
    import optuna.distributions as d

    space, fixed = {}, {}
    for key, dist in search.space.items():
        if dist.kind == "value":
            fixed[key] = dist.value
        elif dist.kind == "choice":
            space[key] = d.CategoricalDistribution(dist.choice)
        elif dist.kind == "int":
            space[key] = d.IntDistribution(*dist.int)
        else:
            low, high = getattr(dist, dist.kind)
            space[key] = d.FloatDistribution(low, high, log=dist.kind == "loguniform")
    return space, fixed


def objectives(search: SearchConfig) -> tuple[str | list[str], str | list[str]]:
    if search.second_metric:
        return [search.metric, search.second_metric], [search.mode, search.second_mode]
    return search.metric, search.mode


def make_searcher(search: SearchConfig, sweep_dir: Path, name: str):
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    space, _ = optuna_space(search)
    metric, mode = objectives(search)
    storage = optuna.storages.RDBStorage(f"sqlite:///{sweep_dir / 'optuna.db'}")
    return OptunaSearch(space, metric=metric, mode=mode, sampler=optuna.samplers.TPESampler(seed=search.seed),
                        study_name=name, storage=storage,
                        points_to_evaluate=[p for p in search.points_to_evaluate if p] or None)


def make_scheduler(search: SearchConfig, steps: int):
    if search.scheduler.name == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="progress/step", metric=search.metric, mode=search.mode, max_t=steps,
                         grace_period=min(search.scheduler.grace_period, steps),
                         reduction_factor=search.scheduler.reduction_factor)


def trial_config(base: dict, sampled: dict[str, Any], fixed: dict[str, Any], trial_id: str, storage: str) -> TrialConfig:
    data = apply_overrides(base, {**fixed, **sampled, "name": trial_id, "storage": storage})
    return TrialConfig.model_validate(data)


def make_trainable(base: dict, fixed: dict[str, Any], storage: str, tracking: dict, stop: StopRequest):
    """The Tune trial: one Ray Train run of the RL loop, tracked as a nested MLflow run.

    A restarted trial (--resume) finds its Train run's checkpoint and its MLflow run by its id.
    """

    def trainable(sampled: dict[str, Any]) -> None:
        from ray import tune
        from ray.tune.integration.ray_train import TuneReportCallback

        trial_id = tune.get_context().get_trial_id()
        cfg = trial_config(base, sampled, fixed, trial_id, storage)
        model_path = resolve_model_path(cfg.model, cfg.cache_dir)
        tracker = Tracker(tracking["uri"], cfg.logging.experiment)
        run_id = tracker.start_trial_run(cfg, parent_run_id=tracking["parent_run_id"], resume=True,
                                         tags={"kind": "trial", "sweep": tracking["sweep"], "trial_id": trial_id})
        store = load_offline(cfg, model_path)
        if store is not None:
            tracker.log_offline_store(run_id, store)
        result = fit_trial(cfg, model_path, tracking={"uri": tracking["uri"], "run_id": run_id}, store=store,
                           run_callbacks=[TuneReportCallback()], stop_file=stop.uri)
        if result.error:
            raise result.error
        if (result.metrics or {}).get("progress/preempted"):
            # Checkpointed for a resume: tell the driver, and stay "running" so that Tune neither
            # closes the trial nor starts another in its place before the driver exits.
            tracker.finish(run_id, "stopped")
            stop.acknowledge(trial_id)
            while True:
                time.sleep(60)

    return trainable


class TrialStates(Callback):
    """Tune callback: closes each trial's MLflow run with its state (finished, pruned, errored),
    and keeps `RUNNING` for the SIGTERM path.

    A module-level class, so that the copy Tune pickles with the sweep (and a --resume restores)
    still updates this module's `RUNNING`.
    """

    def __init__(self, tracker: Tracker, sweep: str, steps: int):
        self.tracker, self.sweep, self.steps = tracker, sweep, steps

    def on_trial_start(self, iteration, trials, trial, **info):
        RUNNING.add(trial.trial_id)

    def _close(self, trial, state: str) -> None:
        from trainables.rollout.service import remove_engine_group

        RUNNING.discard(trial.trial_id)
        remove_engine_group(trial.trial_id)  # a pruned trial's actor is killed before its `finally` runs
        self.tracker.finish_sweep_trial(self.sweep, trial.trial_id, state)

    def on_trial_complete(self, iteration, trials, trial, **info):
        done = (trial.last_result or {}).get("progress/step", 0) >= trial.config.get("learner.steps", self.steps)
        self._close(trial, "finished" if done else "pruned")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._close(trial, "errored")


def ranked_table(results, search: SearchConfig, keys: list[str], steps: int) -> Table:
    table = Table(title=f"trials ranked by {search.metric} ({search.mode})")
    for column in ("trial", "state", "steps", search.metric, *keys):
        table.add_column(column, justify="right")
    reverse = search.mode == "max"
    rows = sorted((r for r in results if r.metrics), reverse=reverse,
                  key=lambda r: r.metrics.get(search.metric, float("-inf") if reverse else float("inf")))
    for r in rows:
        m = r.metrics
        done = m.get("progress/step", 0) >= r.config.get("learner.steps", steps)
        state = "errored" if r.error else ("finished" if done else "stopped early")
        table.add_row(m.get("trial_id", "?"), state, f"{m.get('progress/step', 0):.0f}",
                      f"{m.get(search.metric, float('nan')):.4g}",
                      *[f"{r.config.get(k)!s:.8}" for k in keys])
    return table


def gpu_bound_concurrency(trial: TrialConfig, wanted: int) -> int:
    """Trials at once: the spec's, bounded by the GPUs the cluster has now (each trial holds `trial.gpus`)."""
    import ray

    if not trial.gpus:
        return wanted
    have = ray.cluster_resources().get("GPU", 0)
    if not have:  # an autoscaling cluster adds GPU nodes as trials ask for them
        console.print(f"no GPU in the cluster yet: {wanted} trial(s) at once, {trial.gpus:g} GPU(s) each")
        return wanted
    fits = max(1, int(have // trial.gpus))
    if fits < wanted:
        console.print(f"{fits} trial(s) at once: the cluster's {have:g} GPUs hold {fits} of {trial.gpus:g} GPU(s)")
    return min(wanted, fits)


def dry_run(search: SearchConfig, base: dict, fixed: dict, count: int = 4) -> None:
    import optuna

    space, _ = optuna_space(search)
    console.print(derived_numbers(TrialConfig.model_validate(base), search), soft_wrap=True)
    console.print(f"space: {', '.join(space) or '(fixed only)'}; fixed: {fixed or '-'}")
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=search.seed),
                                direction="maximize" if search.mode == "max" else "minimize")
    for point in search.points_to_evaluate:
        study.enqueue_trial(point)
    for i in range(count):
        sampled = study.ask(space).params
        trial_config(base, sampled, fixed, f"dry-{i}", "runs")  # each proposal is a valid trial
        console.print(f"trial {i}: {sampled}")
        study.tell(study.trials[-1].number, state=optuna.trial.TrialState.PRUNED)


def run(spec: str, args) -> int:
    start = time.perf_counter()
    overrides = list(args.overrides)
    base_cfg, search, base = load_sweep_spec(spec, overrides, check_files=not args.dry_run)
    if args.num_samples:
        search.num_samples = args.num_samples
    if args.max_concurrent is not None:
        if args.max_concurrent < 1:
            raise SpecError(f"--max-concurrent must be >= 1 (got {args.max_concurrent})")
        search.max_concurrent_trials = args.max_concurrent
    _, fixed = optuna_space(search)
    if args.dry_run:
        dry_run(search, base, fixed)
        return 0
    name = args.name or base_cfg.name
    storage = args.storage or base_cfg.storage
    sweep_uri = f"{storage.rstrip('/')}/{name}" if "://" in storage else str(Path(storage_uri(storage)) / name)
    # The Optuna study and the best trial's spec stay on a local disk when the sweep lives in a bucket.
    sweep_dir = Path(sweep_uri) if "://" not in storage else Path(".cache") / "sweeps" / name
    check_resumable(sweep_uri, name, args.resume)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    resolve_model_path(base_cfg.model, base_cfg.cache_dir)  # build once, here
    uri = args.tracking_uri or base_cfg.logging.tracking_uri
    if uri is None and "://" in storage:
        raise SpecError(f"--tracking-uri is needed with a storage URI ({storage}): an MLflow server such as "
                        f"http://HOST:5000 (the default sqlite store is a local file)")
    uri = uri or default_tracking_uri(storage)
    base = apply_overrides(base, {"logging.tracking_uri": uri})  # every trial records where the sweep does
    tracker = Tracker(uri, base_cfg.logging.experiment)
    parent = tracker.start_sweep_run(name, spec_text=Path(spec).read_text(), search=search.model_dump(mode="json"),
                                     resume=args.resume)
    console.print(f"sweep {name}{' (resumed)' if args.resume else ''}: {search.num_samples} trials, "
                  f"MLflow run {parent} in {uri}")
    init_ray(logical_cpus(base_cfg) * search.max_concurrent_trials)
    search.max_concurrent_trials = gpu_bound_concurrency(base_cfg, search.max_concurrent_trials)
    stop = StopRequest(sweep_uri)
    stop.clear()
    stop.on_sigterm(lambda: stop_when_checkpointed(stop, tracker, parent))
    steps = fixed.get("learner.steps", base_cfg.learner.steps)
    if "learner.steps" in search.space and search.space["learner.steps"].kind != "value":
        steps = max(search.space["learner.steps"].candidates())  # ASHA's horizon: the longest trial
    trainable = make_trainable(base, fixed, f"{sweep_uri}/trials", {"uri": uri, "parent_run_id": parent, "sweep": name},
                               stop)
    results = fit_sweep(search, trainable, sweep_uri, sweep_dir, name, tracker, steps, args.resume)
    best = report(results, search, sweep_dir, base, fixed, steps)
    tracker.finish_sweep(parent, best, {"wall_s": time.perf_counter() - start})
    console.print(f"sweep done in {time.perf_counter() - start:.0f} s")
    console.print(f"MLflow: mlflow ui --backend-store-uri {uri} --host 127.0.0.1")
    return 0


def check_resumable(sweep_uri: str, name: str, resume: bool) -> None:
    from ray import tune

    exists = tune.Tuner.can_restore(f"{sweep_uri}/tune")
    if resume and not exists:
        raise SpecError(f"--resume: no sweep named {name!r} to resume in {sweep_uri}")
    if exists and not resume:
        raise SpecError(f"--name: a sweep named {name!r} already exists in {sweep_uri}; pass --resume to "
                        f"continue it, or --name NEW for a new sweep")


def stop_when_checkpointed(stop: StopRequest, tracker: Tracker, parent: str | None) -> None:
    """SIGTERM: once every running trial has checkpointed (or after STOP_GRACE_S), exit for a resume."""
    console.print(f"SIGTERM: {len(RUNNING)} running trials checkpoint at their next step boundary, then the "
                  f"sweep stops")

    def wait_and_exit() -> None:
        deadline = time.time() + STOP_GRACE_S
        while not RUNNING <= stop.acknowledged() and time.time() < deadline:
            time.sleep(1)
        missing = RUNNING - stop.acknowledged()
        tracker.finish(parent, "stopped")
        console.print(f"stopped; {len(RUNNING) - len(missing)} trials checkpointed"
                      f"{f', {sorted(missing)} did not in time' if missing else ''}: rerun the same command "
                      f"with --resume to continue", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        os._exit(STOPPED_EXIT_CODE)  # the trials hold their slots until the driver (and its job) goes

    threading.Thread(target=wait_and_exit, daemon=True).start()


def fit_sweep(search, trainable, sweep_uri: str, sweep_dir: Path, name: str, tracker, steps: int, resume: bool):
    from ray import tune

    # Tune saves its state (trials, searcher, scheduler) at most this often: what a killed driver loses.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    trainable = tune.with_resources(trainable, {"CPU": 0.5})  # the driver only: Train workers reserve their own
    if resume:  # the searcher (with its Optuna study), the scheduler and every trial come back as they were
        return tune.Tuner.restore(f"{sweep_uri}/tune", trainable, resume_unfinished=True, resume_errored=False).fit()
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=make_searcher(search, sweep_dir, name),
                                    scheduler=make_scheduler(search, steps), num_samples=search.num_samples,
                                    max_concurrent_trials=search.max_concurrent_trials),
        run_config=tune.RunConfig(name="tune", storage_path=sweep_uri, callbacks=[TrialStates(tracker, name, steps)]),
    )
    return tuner.fit()


def report(results, search: SearchConfig, sweep_dir: Path, base: dict, fixed: dict, steps: int) -> dict:
    """Print the ranked trials, write the best trial's spec; return the best trial's summary."""
    keys = list(optuna_space(search)[0])
    console.print(ranked_table(results, search, keys, steps))
    metric, mode = objectives(search)
    if not any(r.metrics and search.metric in r.metrics for r in results):
        raise SweepFailed(f"no trial reported {search.metric}; their errors are in {sweep_dir / 'tune'}")
    best = results.get_best_result(metric=search.metric, mode=search.mode, filter_nan_and_inf=True)
    # The final model's spec: the winner's settings, then the spec's `search.final` (longer, bigger).
    cfg = trial_config(base, {**{k: best.config[k] for k in keys}, **search.final}, fixed, f"{sweep_dir.name}-best",
                       base.get("storage", "runs"))
    path = sweep_dir / BEST_SPEC
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    console.print(f"best trial {best.metrics.get('trial_id')}: {search.metric} = {best.metrics.get(search.metric):.4g} "
                  f"with {({k: best.config[k] for k in keys})}")
    console.print(f"the final model's spec: {path}  (python -m orchestrator.train --best-of {sweep_dir})")
    return {"trial_id": best.metrics.get("trial_id"), "metric": best.metrics.get(search.metric),
            "params": {k: best.config[k] for k in keys}, "spec": str(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.sweep", description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="experiment spec with a search: section, e.g. search_spaces/ead.yaml")
    parser.add_argument("--name", help="sweep name (default: the spec's name)")
    parser.add_argument("--storage", help="folder or URI holding the sweep (default: the spec's storage)")
    parser.add_argument("--num-samples", type=int, help="trials (default: search.num_samples)")
    parser.add_argument("--max-concurrent", type=int, help="trials at once (default: search.max_concurrent_trials)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite inside the storage)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a base trial field, e.g. --set learner.steps=10 (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the space and the first proposals only")
    parser.add_argument("--resume", action="store_true",
                        help="continue the sweep of the same name and storage (unfinished trials from their checkpoints)")
    args = parser.parse_args(argv)
    try:
        return run(args.spec, args)
    except (SpecError, FileNotFoundError, SweepFailed) as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    # Run the importable module, not this `__main__` copy: Tune pickles the callbacks with the sweep,
    # and a class from `__main__` would be pickled by value, cut off from this module's `RUNNING`.
    from orchestrator.sweep import main as sweep_main

    sys.exit(sweep_main())
