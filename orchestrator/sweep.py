"""python -m orchestrator.sweep SPEC.yaml [--name N] [--storage PATH_OR_URI] [--num-samples K]
[--max-concurrent C] [--set key.path=value ...] [--tracking-uri URI] [--dry-run]

A Ray Tune experiment over the spec's `search:` space: Optuna's TPE proposes trial settings (its
study in sqlite beside the sweep, so its history outlives the driver), ASHA stops weak trials early,
each trial is one Ray Train run of the RL loop with its own rollout service, and MLflow records one
parent run for the sweep and one nested run per trial.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from orchestrator.spec import SearchConfig, SpecError, apply_overrides, load_sweep_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from orchestrator.train import fit_trial, init_ray, load_offline, logical_cpus, storage_uri
from trainables.config import TrialConfig
from trainables.data.bootstrap import resolve_model_path

console = Console()
BEST_SPEC = "best_trial.yaml"


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


def absolute_paths(base: dict) -> dict:
    """The base trial with its local paths made absolute: Tune runs each trial in its own folder."""
    out = apply_overrides(base, {"cache_dir": str(Path(base.get("cache_dir", ".cache")).resolve())})
    if (out.get("model") or {}).get("path"):
        out["model"]["path"] = str(Path(out["model"]["path"]).resolve())
    for source in (out.get("offline") or {}).get("files", []):
        source["path"] = str(Path(source["path"]).resolve())
    return out


def make_trainable(base: dict, fixed: dict[str, Any], storage: str, tracking: dict):
    """The Tune trial: one Ray Train run of the RL loop, tracked as a nested MLflow run."""

    def trainable(sampled: dict[str, Any]) -> None:
        from ray import tune
        from ray.tune.integration.ray_train import TuneReportCallback

        trial_id = tune.get_context().get_trial_id()
        cfg = trial_config(base, sampled, fixed, trial_id, storage)
        model_path = resolve_model_path(cfg.model.path, cfg.model.tiny, cfg.cache_dir)
        tracker = Tracker(tracking["uri"], cfg.logging.experiment)
        run_id = tracker.start_trial_run(cfg, parent_run_id=tracking["parent_run_id"],
                                         tags={"kind": "trial", "sweep": tracking["sweep"], "trial_id": trial_id})
        store = load_offline(cfg, model_path)
        if store is not None:
            tracker.log_offline_store(run_id, store)
        result = fit_trial(cfg, model_path, tracking={"uri": tracking["uri"], "run_id": run_id}, store=store,
                           run_callbacks=[TuneReportCallback()])
        if result.error:
            raise result.error

    return trainable


class TrialStates:
    """Tune callback: closes each trial's MLflow run with its state (finished, pruned, errored)."""

    def __new__(cls, tracker: Tracker, sweep: str, steps: int):
        from ray.tune import Callback

        class _States(Callback):
            def _close(self, trial, state: str) -> None:
                tracker.finish_sweep_trial(sweep, trial.trial_id, state)

            def on_trial_complete(self, iteration, trials, trial, **info):
                done = (trial.last_result or {}).get("progress/step", 0) >= trial.config.get("learner.steps", steps)
                self._close(trial, "finished" if done else "pruned")

            def on_trial_error(self, iteration, trials, trial, **info):
                self._close(trial, "errored")

        return _States()


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


def dry_run(search: SearchConfig, base: dict, fixed: dict, count: int = 4) -> None:
    import optuna

    space, _ = optuna_space(search)
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
    base_cfg, search, base = load_sweep_spec(spec, overrides)
    if args.num_samples:
        search.num_samples = args.num_samples
    if args.max_concurrent is not None:
        if args.max_concurrent < 1:
            raise SpecError(f"--max-concurrent must be >= 1 (got {args.max_concurrent})")
        search.max_concurrent_trials = args.max_concurrent
    _, fixed = optuna_space(search)
    base = absolute_paths(base)
    if args.dry_run:
        dry_run(search, base, fixed)
        return 0
    name = args.name or base_cfg.name
    storage = args.storage or base_cfg.storage
    sweep_dir = Path(storage_uri(storage)) / name if "://" not in storage else Path(".cache") / "sweeps" / name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    resolve_model_path(base_cfg.model.path, base_cfg.model.tiny, base_cfg.cache_dir)  # build once, here
    uri = args.tracking_uri or base_cfg.logging.tracking_uri or default_tracking_uri(storage)
    tracker = Tracker(uri, base_cfg.logging.experiment)
    parent = tracker.start_sweep_run(name, spec_text=Path(spec).read_text(), search=search.model_dump(mode="json"))
    console.print(f"sweep {name}: {search.num_samples} trials, MLflow run {parent} in {uri}")
    init_ray(logical_cpus(base_cfg) * search.max_concurrent_trials)
    steps = fixed.get("learner.steps", base_cfg.learner.steps)
    if "learner.steps" in search.space and search.space["learner.steps"].kind != "value":
        steps = max(search.space["learner.steps"].candidates())  # ASHA's horizon: the longest trial
    results = fit_sweep(search, base, fixed, name, storage, tracker, parent, steps)
    best = report(results, search, sweep_dir, base, fixed, steps)
    tracker.finish_sweep(parent, best, {"wall_s": time.perf_counter() - start})
    console.print(f"sweep done in {time.perf_counter() - start:.0f} s")
    console.print(f"MLflow: mlflow ui --backend-store-uri {uri} --host 127.0.0.1")
    return 0


def fit_sweep(search, base, fixed, name, storage, tracker, parent, steps):
    from ray import tune

    metric, mode = objectives(search)
    trainable = make_trainable(base, fixed, storage_uri(f"{storage}/{name}/trials") if "://" not in storage
                               else f"{storage}/{name}/trials",
                               {"uri": tracker.uri, "parent_run_id": parent, "sweep": name})
    sweep_dir = Path(storage_uri(storage)) / name
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"CPU": 0.5}),  # the driver only: Train workers reserve their own
        tune_config=tune.TuneConfig(search_alg=make_searcher(search, sweep_dir, name),
                                    scheduler=make_scheduler(search, steps), num_samples=search.num_samples,
                                    max_concurrent_trials=search.max_concurrent_trials),
        run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir),
                                  callbacks=[TrialStates(tracker, name, steps)]),
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
    cfg = trial_config(base, {k: best.config[k] for k in keys}, fixed, f"{sweep_dir.name}-best", base.get("storage", "runs"))
    path = sweep_dir / BEST_SPEC
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    console.print(f"best trial {best.metrics.get('trial_id')}: {search.metric} = {best.metrics.get(search.metric):.4g} "
                  f"with {({k: best.config[k] for k in keys})}")
    console.print(f"its spec: {path}  (python -m orchestrator.train {path})")
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
    args = parser.parse_args(argv)
    try:
        return run(args.spec, args)
    except (SpecError, FileNotFoundError, SweepFailed) as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
