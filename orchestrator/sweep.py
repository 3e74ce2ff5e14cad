"""python -m orchestrator.sweep SPEC.yaml [--name N] [--storage PATH_OR_URI] [--num-samples K]
[--max-concurrent C] [--seeds R] [--set key.path=value ...] [--tracking-uri URI] [--dry-run] [--resume]

A Ray Tune experiment over the spec's `search:` space in two stages. Selection: Optuna proposes
configurations (TPE after `sampler.n_startup_trials`, its study in sqlite beside the sweep, so its
history outlives the driver), each configuration trains with `search.seeds` seeds side by side (one Ray
Train run of the RL loop each, with its own rollout service), the searcher and the scheduler see the
mean over those seeds (`intervals`: stopped only when its interval lies below the rung's best), and
MLflow records one parent run for the sweep and one nested run per seed (param `seed`, tags `config`,
`stage`). At the end: every configuration's mean with its 95% interval, the validation's own standard
error beside the seed spread, and the selection's estimate of best - baseline (`search.baseline`),
labelled as biased upward. Confirmation (`search.confirm`): the best configuration other than the
baseline and the baseline, trained again on fresh seeds, paired, looked at sequentially with alpha
spent over the looks: better, worse, equivalent within +-margin, or inconclusive at R pairs.

`--resume` (same spec, name and storage) continues a sweep whose driver died or was stopped:
finished and errored trials stay as they are, every unfinished one continues from its latest
checkpoint in its own MLflow run, the Optuna study, the searcher and the scheduler go on where they
were, and the confirmation walks its looks again (each seed run continues from its checkpoint).
SIGTERM makes every running trial checkpoint at its next step boundary; the driver then exits with 75,
ready for `--resume`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.table import Table

from orchestrator.cli import ExperimentFailed, cli, closes_pools, later, parser
from orchestrator.console import console, number_table, roles, short_params
from orchestrator.spec import BEST_SPEC, SearchConfig, apply_overrides, derived_numbers, load_sweep_spec
from trainables.config import TrialConfig

if TYPE_CHECKING:
    from orchestrator.experiment import Experiment
    from orchestrator.summary import ConfigSummary

# Ray Tune and the experiment's machinery (MLflow, torch) load once the spec has passed its checks.
tune = later("ray.tune")
experiment, tracking = later("orchestrator.experiment"), later("orchestrator.tracking")
tune_trial, summary = later("orchestrator.seeds"), later("orchestrator.summary")
launch = later("orchestrator.launch")


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


def make_sampler(search: SearchConfig):
    """The sampler docs/guide.md names is the one that proposes: TPE after `n_startup_trials` (random until
    then, as Optuna's TPE is), multivariate over the searched fields, with a constant liar when
    configurations run at once; or random search."""
    import warnings

    import optuna

    if search.sampler.name == "random":
        return optuna.samplers.RandomSampler(seed=search.seed)
    with warnings.catch_warnings():  # multivariate and constant_liar are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=search.seed,
            n_startup_trials=search.sampler.n_startup_trials,
            multivariate=True,
            constant_liar=search.max_concurrent_trials > 1,
        )


def make_searcher(search: SearchConfig, study_file: Path, name: str, tracking: dict | None = None):
    import optuna

    from orchestrator.searcher import StepOptunaSearch

    space, _ = optuna_space(search)
    metric, mode = objectives(search)
    storage = optuna.storages.RDBStorage(f"sqlite:///{study_file}")
    return StepOptunaSearch(
        space,
        metric=metric,
        mode=mode,
        sampler=make_sampler(search),
        study_name=name,
        storage=storage,
        tracking=tracking,
        points_to_evaluate=[p for p in search.points_to_evaluate if p] or None,
    )


def make_scheduler(search: SearchConfig, steps: int, record_to: str | None = None):
    """The spec's early stopping on RL steps, each stop recorded under `record_to` (the experiment's
    folder or URI); its metric and mode come from the TuneConfig (which records them for Tune's tools)."""
    if search.scheduler.name == "none":
        return None
    from orchestrator.scheduler import IntervalRungs, RecordedASHA, rungs

    sched = search.scheduler
    if sched.name == "intervals":
        return IntervalRungs(
            rungs(min(sched.grace_period, steps), sched.reduction_factor, steps), sched.level, record_to=record_to
        )
    return RecordedASHA(
        time_attr="progress/step",
        max_t=steps,
        grace_period=min(sched.grace_period, steps),
        reduction_factor=sched.reduction_factor,
        record_to=record_to,
    )


def trial_config(
    base: dict, sampled: dict[str, Any], fixed: dict[str, Any], trial_id: str, storage: str
) -> TrialConfig:
    data = apply_overrides(base, {**fixed, **sampled, "name": trial_id, "storage": storage})
    return TrialConfig.model_validate(data)


def ranked_table(summaries: list[ConfigSummary], search: SearchConfig, keys: list[str]) -> Table:
    title = f"configurations ranked by {search.metric} ({search.mode}), mean over {search.seeds} seed(s)"
    short = short_params(dict.fromkeys(keys, 0))
    table = number_table(title, ["config", "state", "steps", "mean [95% CI]", "per seed", "val SE", *short])
    for s in ranked(summaries, search):
        table.add_row(
            s.config_id,
            s.state,
            str(s.steps),
            s.interval.format() if s.interval else "-",
            " ".join(f"{v:.3f}" for v in s.values) or "-",
            f"{s.se:.3f}" if s.se is not None else "-",
            *short_params({k: s.params.get(k) for k in keys}).values(),
        )
    return table


def ranked(summaries: list[ConfigSummary], search: SearchConfig) -> list[ConfigSummary]:
    """Configurations with an objective, best first; the others after them."""
    sign = 1 if search.mode == "max" else -1
    return sorted(summaries, key=lambda s: -sign * s.interval.mean if s.interval else float("inf"))


def dry_run(search: SearchConfig, base: dict, fixed: dict, count: int = 4) -> None:
    import optuna

    space, _ = optuna_space(search)
    console.print(derived_numbers(TrialConfig.model_validate(base), search), soft_wrap=True)
    console.print(f"space: {', '.join(space) or '(fixed only)'}; fixed: {fixed or '-'}")
    study = optuna.create_study(
        sampler=make_sampler(search), direction="maximize" if search.mode == "max" else "minimize"
    )
    for point in search.points_to_evaluate:
        study.enqueue_trial(point)
    for i in range(count):
        sampled = study.ask(space).params
        trial_config(base, sampled, fixed, f"dry-{i}", "runs")  # each proposal is a valid trial
        console.print(f"trial {i}: {sampled}")
        study.tell(study.trials[-1].number, state=optuna.trial.TrialState.PRUNED)


@closes_pools
def run(spec: str, args) -> int:
    overrides = list(args.overrides)
    base_cfg, search, base = load_sweep_spec(spec, overrides, check_files=not args.dry_run)
    search.num_samples = args.num_samples or search.num_samples
    search.seeds = getattr(args, "seeds", None) or search.seeds
    search.max_concurrent_trials = args.max_concurrent or search.max_concurrent_trials
    _, fixed = optuna_space(search)
    if args.dry_run:
        dry_run(search, base, fixed)
        return 0
    runs = tune_trial.runs_at_once(base_cfg, search.seeds, search.seed_runs)  # a configuration's Ray Train runs
    exp = experiment.start(
        "sweep",
        experiment.given(args.name, base_cfg.name),
        experiment.given(args.storage, base_cfg.storage),
        base_cfg,
        tracking_uri=args.tracking_uri,
        spec=spec,
        params=search.model_dump(mode="json"),
        resume=args.resume,
        force=getattr(args, "force", False),
        trust_unsealed=getattr(args, "trust_unsealed", False),
        seeds=search.all_seeds,
        cpus_per_trial=experiment.cluster_cpus(base_cfg, search.max_concurrent_trials * runs),
    )
    base = apply_overrides(base, {"logging.tracking_uri": exp.tracking_uri})  # every trial records where the sweep does
    console.print(
        f"sweep {exp.name}{' (resumed)' if args.resume else ''}: {search.num_samples} configurations x "
        f"{search.seeds} seed(s), MLflow run {exp.parent} in {exp.tracking_uri}"
    )
    search.max_concurrent_trials = launch.trials_that_fit(base_cfg, search.max_concurrent_trials * runs) // runs or 1
    steps = horizon(search, fixed, base_cfg)
    trainable = tune_trial.make_trainable(
        apply_overrides(base, fixed), exp, search.metric, search.seeds, search.seed_runs
    )

    def tune_config():
        tracking = {"uri": exp.tracking_uri, "experiment": exp.tracker.experiment, "sweep": exp.name}
        tracking["storage"] = exp.uri
        return tune.TuneConfig(
            search_alg=make_searcher(search, exp.folder / experiment.STUDY_FILE, exp.name, tracking),
            scheduler=make_scheduler(search, steps, record_to=exp.uri),
            metric=search.metric,
            mode=search.mode,
            num_samples=search.num_samples,
            max_concurrent_trials=search.max_concurrent_trials,
        )

    results = experiment.fit(
        exp, trainable, tune_config, seed_list(base_cfg, search.seeds), args.resume, search.seed_runs
    )
    report(results, search, exp, base, fixed)
    experiment.write_report(exp)
    console.print(f"sweep done in {time.perf_counter() - exp.started:.0f} s")
    console.print(f"MLflow: {tracking.ui_hint(exp.tracking_uri)}", soft_wrap=True)
    if view := exp.tracker.trials_view(exp.name, search.metric, list(search.space)):
        console.print(f"  and open {view}", soft_wrap=True)
    return 0


def horizon(search: SearchConfig, fixed: dict, base_cfg: TrialConfig) -> int:
    """The scheduler's horizon: the RL steps of the longest trial the search may propose."""
    if "learner.steps" in search.space and search.space["learner.steps"].kind != "value":
        return max(search.space["learner.steps"].candidates())
    return fixed.get("learner.steps", base_cfg.learner.steps)


def seed_list(base_cfg: TrialConfig, seeds: int) -> list[int]:
    return [base_cfg.seed + r for r in range(seeds)]


def is_baseline(config: ConfigSummary, baseline: dict[str, Any] | None) -> bool:
    return baseline is not None and all(config.params.get(k) == v for k, v in baseline.items())


def baseline_and_challenger(
    summaries: list[ConfigSummary], finished: list[ConfigSummary], search: SearchConfig
) -> tuple[ConfigSummary | None, ConfigSummary | None]:
    """(the baseline, the best configuration other than it that ran to the end); None where missing."""
    baseline = next((s for s in summaries if is_baseline(s, search.baseline)), None)
    return baseline, next((s for s in finished if s is not baseline), None)


def report(results, search: SearchConfig, exp: Experiment, base: dict, fixed: dict) -> dict:
    """Print the ranked configurations, the selection's estimate and, with `search.confirm`, the
    confirmation's verdict; write the final model's spec; close the parent run with all of it."""
    keys = list(optuna_space(search)[0])
    summaries = summary.summarize(
        results, search.metric, keys, exp.uri, lambda config: exp.tracker.config_seeds(exp.name, config, search.metric)
    )
    console.print(ranked_table(summaries, search, keys))
    console.print(summary.noise_line(summaries, search.metric), highlight=False, soft_wrap=True)
    scored = [s for s in summaries if s.interval is not None]
    if not scored:
        raise ExperimentFailed(f"no configuration reported {search.metric}; their errors are in {exp.uri}/tune")
    experiment.log_config_metrics(exp, summaries, search.metric)
    # The best is chosen among configurations that ran to the end: stopped ones were judged earlier.
    finished = ranked([s for s in scored if s.state == "finished"] or scored, search)
    best = finished[0]
    lines, metrics, tags = verdict_against_baseline(summaries, finished, search)
    tags["selected_best"] = (
        best.config_id
    )  # first in the selection's ranking (`best_trial`: what the final model trains)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    final, more = best, []
    if search.confirm is not None:
        more, final = confirmation(exp, apply_overrides(base, fixed), summaries, finished, search, metrics, tags)
        lines += more
    # The final model's spec: the chosen settings, then the spec's `search.final` (longer, bigger).
    cfg = trial_config(
        base, {**final.params, **search.final}, fixed, f"{exp.folder.name}-best", base.get("storage", "runs")
    )
    path = exp.folder / BEST_SPEC
    path.write_text(
        "".join(f"# {line}\n" for line in lines) + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    )
    console.print(f"the final model's spec: {path}  (python -m orchestrator.train --best-of {exp.folder})")
    chosen = {"trial_id": final.config_id, "metric": final.interval.mean, "params": final.params, "spec": str(path)}
    baseline = next((s for s in summaries if is_baseline(s, search.baseline)), None)
    names = {
        c: f"{c} ({role})"
        for c, role in roles(baseline and baseline.config_id, best.config_id, final.config_id).items()
    }
    table = (
        summary.markdown_table(ranked(summaries, search), search.metric, keys, names) + "\n" + "\n\n".join(lines) + "\n"
    )
    exp.tracker.finish_sweep(
        exp.parent,
        chosen,
        {"wall_s": time.perf_counter() - exp.started},
        metrics={"best/ci_low": final.interval.low, "best/ci_high": final.interval.high, **metrics},
        tags=tags,
        tables={"configurations.md": table},
        description="\n\n".join(more or lines[1:] or lines),
    )  # the verdict, the final one first
    return chosen


def verdict_against_baseline(
    summaries: list[ConfigSummary], finished: list[ConfigSummary], search: SearchConfig
) -> tuple[list[str], dict[str, float], dict[str, str]]:
    """(lines to print, the parent run's metrics, its tags): the selection's estimate. It is about the
    best configuration other than the baseline (the baseline, when best, differs from itself by zero;
    the question is whether the search found anything better than where it started), measured on the
    seeds that chose it: biased upward, labelled so, and the verdict only when nothing confirms it."""
    best = finished[0]
    baseline, challenger = baseline_and_challenger(summaries, finished, search)
    lines = [
        f"best configuration {best.config_id}{' (the baseline)' if best is baseline else ''}: {search.metric} = "
        f"{best.interval.format()} over {len(best.values)} seed(s), with "
        + " ".join(f"--set {k}={v:.6g}" if isinstance(v, float) else f"--set {k}={v}" for k, v in best.params.items())
    ]
    result = summary.compare(challenger, baseline, search.mode) if baseline and challenger else None
    if result is None:
        why = (
            baseline
            and challenger
            and summary.incomparable(challenger.params, baseline.params, challenger.steps, baseline.steps)
        )
        lines.append(
            f"no selection estimate: {why}"
            if why
            else "no selection estimate: no baseline (search.baseline, "
            "or points_to_evaluate), or no other configuration that ran to the end"
        )
        return lines, {}, {}
    label = (
        "selected best - baseline" if challenger is best else f"selected runner-up {challenger.config_id} - baseline"
    )
    lines.append(
        result.line(f"the baseline {baseline.config_id}", label) + " (on the seeds that selected it: biased upward)"
    )
    metrics = {
        "select/best_minus_baseline/mean": result.diff.mean,
        "select/best_minus_baseline/ci_low": result.diff.low,
        "select/best_minus_baseline/ci_high": result.diff.high,
    }
    if result.seeds_needed is not None:
        metrics["select/best_minus_baseline/seeds_needed"] = result.seeds_needed
    return (
        lines,
        metrics,
        {
            "verdict": result.verdict,
            "verdict_stage": "select",
            "verdict_config": challenger.config_id,
            "baseline": baseline.config_id,
        },
    )


def confirmation(
    exp: Experiment,
    base: dict,
    summaries: list[ConfigSummary],
    finished: list[ConfigSummary],
    search: SearchConfig,
    metrics: dict,
    tags: dict,
) -> tuple[list[str], ConfigSummary]:
    """The challenger against the baseline on fresh seeds (`orchestrator.confirm`): its lines, and the
    configuration the final model trains (the challenger if confirmed better, else the baseline).
    Updates the parent run's metrics and tags in place."""
    from orchestrator import confirm

    baseline, challenger = baseline_and_challenger(summaries, finished, search)
    if baseline and challenger:
        why = summary.incomparable(
            challenger.params, baseline.params, confirm.arm_steps(base, challenger), confirm.arm_steps(base, baseline)
        )
    else:
        why = "the search has no baseline or no other configuration that ran to the end"
    if why:
        line = f"no confirmation of {challenger.config_id}: {why}" if challenger else f"no confirmation: {why}"
        console.print(line, highlight=False, soft_wrap=True)
        return [line], baseline or finished[0]
    result = confirm.run_confirmation(
        exp,
        base,
        challenger,
        baseline,
        search.confirm,
        search.metric,
        search.mode,
        first_offset=search.seeds,
        parts=search.seed_runs,
    )
    line = confirm.describe(result, search.confirm, search.metric)
    chosen = challenger if result.look.verdict == "better" else baseline
    stands = (
        f"the final model trains {challenger.config_id}, confirmed better"
        if chosen is challenger
        else f"the baseline {baseline.config_id} stands: the final model trains it"
    )
    for text in (line, stands):
        console.print(text, highlight=False, soft_wrap=True)
    metrics.update(confirm.metrics(result))
    tags.update(
        {
            "verdict": result.look.verdict,
            "verdict_stage": "confirm",
            "verdict_config": challenger.config_id,
            "baseline": baseline.config_id,
            "final_config": chosen.config_id,
        }
    )
    return [line, stands], chosen


def main(argv: list[str] | None = None) -> int:
    command = parser("python -m orchestrator.sweep", __doc__, "search", "search_spaces/ead.yaml", "configurations")
    command.add_argument("--num-samples", type=int, help="configurations (default: search.num_samples)")
    command.add_argument("--seeds", type=int, help="seeds per configuration (default: search.seeds)")
    return cli(run, command, argv)


if __name__ == "__main__":
    # Run the importable module, not this `__main__` copy: Tune pickles the callbacks with the sweep,
    # and a class from `__main__` would be pickled by value, cut off from this module's `RUNNING`.
    from orchestrator.sweep import main as sweep_main

    sys.exit(sweep_main())
