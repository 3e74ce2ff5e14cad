"""python -m orchestrator.study SPEC.yaml [--name N] [--storage PATH_OR_URI] [--seeds R]
[--max-concurrent C] [--set key.path=value ...] [--tracking-uri URI] [--dry-run] [--resume]

A grid, not a search: the spec's named arms (each a set of overrides of its trial fields) x seeds,
as one Ray Tune experiment with a sweep's tracking, `--resume` and SIGTERM behaviour. Each arm is one
Tune trial whose seeds train side by side (`orchestrator.seeds`); MLflow records a parent run and one
nested run per arm and seed (tags `arm`, `config`; param `seed`).

At the end, read back from MLflow, it writes into <storage>/<name>:

    study.json      per arm: the objective at the end (each seed, mean, 95% interval), every
                    val/*/pass_at_k at the end, and the mean and 95% band over seeds of each curve
                    against step; paired differences of each arm from the first, with verdicts
    study.md        those tables
    curves.png      per arm, mean and 95% band over seeds of the objective, policy entropy and
                    response length against step
    pass_at_k.png   per arm, pass@k at the end against k, with 95% intervals
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, ValidationError, field_validator

from orchestrator.cli import ExperimentFailed, cli, closes_pools, later, parser
from orchestrator.console import console
from orchestrator.spec import (
    Configurations,
    Section,
    Seeds,
    SpecError,
    absolute_paths,
    apply_overrides,
    check_metric,
    format_validation_error,
    parse_overrides,
    read_yaml,
    validate_trial,
)
from trainables.config import TrialConfig
from trainables.metrics import OBJECTIVE_NAMESPACES

# The experiment's machinery (Ray Tune, MLflow, SciPy, matplotlib) loads once the spec has passed its checks.
experiment = later("orchestrator.experiment")
tune_trial, summary = later("orchestrator.seeds"), later("orchestrator.summary")
decisions, stats = later("orchestrator.decisions"), later("orchestrator.stats")
tracking, report = later("orchestrator.tracking"), later("orchestrator.report")

ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CURVES = ("policy/entropy", "rollout/response_length")
PASS_AT = re.compile(r"val/[^/]+/pass_at_\d+")


class StudyConfig(Section):
    """A study: named arms x seeds, compared with the first arm."""

    arms: dict[str, dict[str, Any]] = Field(
        description="Arm name -> dotted trial field overrides; the first arm "
        "is the reference the others are compared with."
    )
    seeds: Seeds = Field(3, description="Seeds per arm (the spec's seed + 0, 1, ...).")
    metric: str = Field(
        "val/accuracy",
        description="The primary metric: reported at the end and against step; "
        "its verdicts over arms are Holm-adjusted. Every other metric is exploratory.",
    )
    mode: Literal["max", "min"] = Field("max")
    margin: PositiveFloat | None = Field(
        None,
        description="Equivalence margin on the primary metric (TOST, "
        "Holm-adjusted): `equivalent within +-margin`; none: no equivalence verdict.",
    )
    max_concurrent: Configurations = Field(1, description="Arms running at once (each runs its seeds side by side).")
    seed_runs: Seeds = Field(
        2, description="Ray Train runs an arm's seeds are split over (as a sweep's search.seed_runs)."
    )

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if len(arms) < 2:
            raise ValueError(f"name at least two arms to compare (got {len(arms)})")
        for name in arms:
            if not ARM_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an arm name: letters, digits, '.', '_' or '-', one path component")
        return arms

    @field_validator("metric")
    @classmethod
    def _metric(cls, metric: str) -> str:
        if not metric.startswith(OBJECTIVE_NAMESPACES):
            raise ValueError(f"{metric!r} is not a trial metric (namespaces {', '.join(OBJECTIVE_NAMESPACES)})")
        return metric


def load_study_spec(
    path: str | Path, overrides: list[str] | None = None, check_files: bool = True
) -> tuple[TrialConfig, StudyConfig, dict]:
    """(base trial, study, base trial data), all checked here: every arm must make a valid trial."""
    data = absolute_paths(apply_overrides(read_yaml(path), parse_overrides(overrides)))
    raw = data.pop("study", None)
    if raw is None:
        raise SpecError(f"{path}: study: missing; a study spec needs a study section (see search_spaces/studies/)")
    data.pop("search", None)
    trial = validate_trial(data, str(path), check_files)
    try:
        study = StudyConfig.model_validate(raw, strict=True)
    except ValidationError as e:
        raise SpecError(format_validation_error(f"{path}: study", e)) from None
    if study.metric.startswith("val/") and not trial.validation.every:
        raise SpecError(f"{path}: study.metric: {study.metric} needs validation.every > 0")
    for name, arm in study.arms.items():  # every arm must make a valid trial that logs the study's metric
        try:
            arm_trial = validate_trial(apply_overrides(data, arm), f"{path}: study.arms.{name}", check_files=False)
        except SpecError as e:
            raise SpecError(str(e).splitlines()[0]) from None
        check_metric(arm_trial, study.metric, f"{path}: study.metric (arm {name})")
    return trial, study, data


@closes_pools
def run(spec: str, args) -> int:
    base_cfg, study, base = load_study_spec(spec, args.overrides, check_files=not args.dry_run)
    study.seeds = args.seeds or study.seeds
    study.max_concurrent = args.max_concurrent or study.max_concurrent
    if args.dry_run:
        for name, arm in study.arms.items():
            console.print(f"arm {name}: {arm or '(the spec as it is)'}", highlight=False)
        console.print(
            f"{len(study.arms)} arms x {study.seeds} seeds = {len(study.arms) * study.seeds} trials of "
            f"{base_cfg.learner.steps} steps, {study.max_concurrent} arm(s) at once",
            highlight=False,
        )
        return 0
    from ray import tune

    runs = tune_trial.runs_at_once(base_cfg, study.seeds, study.seed_runs)
    exp = experiment.start(
        "study",
        experiment.given(args.name, base_cfg.name),
        experiment.given(args.storage, base_cfg.storage),
        base_cfg,
        tracking_uri=args.tracking_uri,
        spec=spec,
        params=study.model_dump(mode="json"),
        resume=args.resume,
        force=getattr(args, "force", False),
        trust_unsealed=getattr(args, "trust_unsealed", False),
        seeds=study.seeds,
        cpus_per_trial=experiment.cluster_cpus(base_cfg, study.max_concurrent * runs),
    )
    base = apply_overrides(base, {"logging.tracking_uri": exp.tracking_uri})
    console.print(
        f"study {exp.name}{' (resumed)' if args.resume else ''}: {len(study.arms)} arms x {study.seeds} "
        f"seeds, MLflow run {exp.parent} in {exp.tracking_uri}"
    )
    trainable = tune_trial.make_trainable(base, exp, study.metric, study.seeds, study.seed_runs, arms=study.arms)
    seeds = [base_cfg.seed + r for r in range(study.seeds)]

    def tune_config():
        return tune.TuneConfig(metric=study.metric, mode=study.mode, max_concurrent_trials=study.max_concurrent)

    grid = {"arm": tune.grid_search(list(study.arms))}
    experiment.fit(exp, trainable, tune_config, seeds, args.resume, study.seed_runs, param_space=grid)
    result = collect(exp, study)
    write(result, exp.folder)
    exp.tracker.finish_sweep(
        exp.parent,
        {},
        {"wall_s": time.perf_counter() - exp.started},
        tables={
            "study.md": (exp.folder / "study.md").read_text(),
            "study.json": (exp.folder / "study.json").read_text(),
        },
    )
    console.print((exp.folder / "study.md").read_text(), highlight=False, soft_wrap=True)
    experiment.write_report(exp)
    console.print(f"study done in {time.perf_counter() - exp.started:.0f} s: {exp.folder / 'study.md'}")
    return 0


def seed_runs(exp, study: StudyConfig) -> dict[str, list]:
    """Each arm's runs in seed order, from MLflow."""
    client, tracker = exp.tracker.client, exp.tracker
    runs = client.search_runs(
        [tracker.experiment_id], tracking.tags_filter(sweep=exp.name, kind="trial"), max_results=10_000
    )
    by_arm = {
        name: sorted((r for r in runs if r.data.tags.get("arm") == name), key=lambda r: int(r.data.params["seed"]))
        for name in study.arms
    }
    if not any(by_arm.values()):
        raise ExperimentFailed(f"no arm of {exp.name} recorded a run; their errors are in {exp.uri}/tune")
    return by_arm


def band(histories: list[list[tuple[int, float]]]) -> dict[str, list[float]]:
    """Mean and 95% band over seeds, at the steps every seed logged."""
    steps = sorted(set.intersection(*(set(s for s, _ in h) for h in histories))) if histories else []
    out = {"steps": steps, "mean": [], "ci_low": [], "ci_high": []}
    for step in steps:
        interval = stats.seed_interval([dict(h)[step] for h in histories])
        out["mean"].append(interval.mean)
        out["ci_low"].append(interval.low)
        out["ci_high"].append(interval.high)
    return out


def arm_summary(client, runs: list, study: StudyConfig) -> dict[str, Any]:
    """One arm: the state of each seed, its final values, and each curve's band."""
    final = {
        key: [r.data.metrics.get(key) for r in runs]
        for key in sorted(
            {k for r in runs for k in r.data.metrics if k == study.metric or PASS_AT.fullmatch(k)} | set(CURVES)
        )
    }
    final = {k: v for k, v in final.items() if v and all(x is not None for x in v)}
    se = [r.data.metrics.get(tune_trial.SE_KEY) for r in runs]
    curves, steps = {}, []
    for key in (study.metric, *CURVES):
        # The base policy's validation is the curve's step 0 (`report.with_base`: also for runs recorded
        # before val/* was logged at step 0, which hold it only as <metric>_base).
        histories = [list(zip(*report.with_base(r, key, *report.history(client, r, key)))) for r in runs]
        if histories and all(histories):
            curves[key] = band(histories)
            if key == study.metric:
                steps = [h[-1][0] for h in histories]  # the step each seed's final value is of
        if key == study.metric and histories and all(len(h) > 1 for h in histories):
            # Sample efficiency: the objective averaged over every validation after the base one.
            final[area_key(key)] = [sum(v for s, v in h if s > 0) / sum(1 for s, _ in h if s > 0) for h in histories]
    return {
        "seeds": [int(r.data.params["seed"]) for r in runs],
        "steps": steps,
        "states": [r.data.tags.get("state", "?") for r in runs],
        "final": {
            k: {
                "values": v,
                **interval_dict(stats.seed_interval(v, se[0] if len(v) == 1 and k == study.metric else None)),
            }
            for k, v in final.items()
        },
        "validation_se": sum(x for x in se if x is not None) / max(1, sum(x is not None for x in se)),
        "curves": curves,
    }


def area_key(metric: str) -> str:
    return f"{metric}/mean_over_validations"


def interval_dict(interval) -> dict[str, float]:
    return {"mean": interval.mean, "ci_low": interval.low, "ci_high": interval.high}


def differences(
    arms: dict[str, dict], mode: str, metric: str, margin: float | None = None
) -> dict[str, dict[str, dict]]:
    """Each arm's paired difference from the first, at the end, for every final value they share. The
    primary metric's verdicts are Holm-adjusted over the arms (`decisions.family_verdicts`); every other
    metric's verdict is its own 95% interval's, labelled exploratory."""
    names = list(arms)
    first = arms[names[0]]
    apart = {
        name: why
        for name in names[1:]
        if (
            why := summary.incomparable(
                arms[name].get("overrides", {}), first.get("overrides", {}), arms[name].get("steps"), first.get("steps")
            )
        )
    }
    paired = {
        name: {
            key: (a["values"], first["final"][key]["values"])
            for key, a in arms[name]["final"].items()
            if key in first["final"] and len(a["values"]) == len(first["final"][key]["values"])
        }
        for name in names[1:]
        if name not in apart
    }
    primary = decisions.family_verdicts(
        {name: [x - y for x, y in zip(*pairs[metric])] for name, pairs in paired.items() if metric in pairs},
        margin=margin,
        mode=mode,
    )
    out: dict[str, dict[str, dict]] = {
        name: {
            metric: {"verdict": "not compared", "role": "primary", "line": f"{name} - {names[0]}: not compared: {why}"}
        }
        for name, why in apart.items()
    }
    for name, pairs in paired.items():
        rows = {}
        for key, (a, b) in pairs.items():
            diff, diffs = stats.paired_difference(a, b), [x - y for x, y in zip(a, b)]
            direction = mode if key in (metric, area_key(metric)) or PASS_AT.fullmatch(key) else "max"
            row = {
                **interval_dict(diff),
                "seeds_needed": stats.seeds_needed(diffs),
                "seeds_range": stats.seeds_range(diffs),
            }
            if key == metric:
                row.update(primary[name], role="primary")
            else:
                row.update(verdict=stats.verdict(diff, direction), role="exploratory")
            label = f"{name} - {names[0]}" + ("" if key == metric else f" ({key}, exploratory)")
            row["line"] = stats.describe(diff, row["verdict"], row["seeds_needed"], names[0], label, row["seeds_range"])
            rows[key] = row
        out[name] = rows
    return out


def collect(exp, study: StudyConfig) -> dict[str, Any]:
    """The study's numbers, all from its MLflow runs."""
    by_arm = seed_runs(exp, study)
    arms = {
        name: {"overrides": study.arms[name], **arm_summary(exp.tracker.client, runs, study)}
        for name, runs in by_arm.items()
        if runs
    }
    finals = [arm["final"][study.metric]["values"] for arm in arms.values() if study.metric in arm["final"]]
    sd, df = decisions.pooled_sd(finals)
    pooled = sd if df else None
    return {
        "name": exp.name,
        "metric": study.metric,
        "mode": study.mode,
        "seeds": study.seeds,
        "arms": arms,
        "differences": differences(arms, study.mode, study.metric, study.margin),
        "margin": study.margin,
        "noise": {"seed_sd": pooled, "validation_se": sum(a["validation_se"] for a in arms.values()) / len(arms)},
    }


def markdown(result: dict[str, Any]) -> str:
    metric, arms = result["metric"], result["arms"]
    keys = [metric, *sorted({k for a in arms.values() for k in a["final"] if k != metric})]
    lines = [
        f"# study {result['name']}",
        "",
        f"{len(arms)} arms x {result['seeds']} seeds; 95% intervals over seeds (Student t). Validation standard "
        f"error of {metric}: {result['noise']['validation_se']:.3f}; seed-to-seed SD: "
        + (f"{result['noise']['seed_sd']:.3f}" if result["noise"]["seed_sd"] is not None else "-")
        + ".",
        "",
        "## At the end",
        "",
        "| arm | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for name, arm in arms.items():
        cells = [fmt(arm["final"].get(k)) for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    first = next(iter(arms))
    margin = result.get("margin")
    lines += [
        "",
        f"## Paired differences from {first}",
        "",
        f"Primary metric: {metric}; its verdicts are Holm-adjusted over the {len(arms) - 1} comparisons "
        f"(family-wise alpha 0.05{f', equivalence by TOST within +-{margin:g}' if margin else ''}). Every other "
        "metric is exploratory: its verdict is its own unadjusted 95% interval's. Seeds needed: pairs for a "
        "paired t-test at alpha 0.05 (two-sided) with power 0.8 at the measured effect, and the range over "
        "the effect's 95% interval (post hoc: a rough guide, not a promise).",
        "",
        "| arm | metric | role | difference [95% CI] | p (Holm) | verdict | seeds needed [range] |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["differences"].items():
        for key, row in rows.items():
            if row["verdict"] == "not compared":
                lines.append(f"| {name} | {key} | {row['role']} | - | - | {row['line'].split(': ', 1)[1]} | - |")
                continue
            p = f"{row['p_holm']:.3f}" if row.get("p_holm") == row.get("p_holm") and "p_holm" in row else "-"
            lines.append(
                f"| {name} | {key} | {row['role']} | {fmt(row)} | {p} | {row['verdict']} | "
                f"{seeds_cell(row['seeds_needed'], row['seeds_range'])} |"
            )
    return "\n".join(lines) + "\n"


def seeds_cell(needed: int | None, span) -> str:
    if needed is None:
        return "-"
    top = "unbounded" if span and span[1] >= stats.MAX_SEEDS else span and span[1]
    return stats.seeds_text(needed) + (f" [{span[0]}, {top}]" if span else "")


def fmt(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["ci_low"] != row["ci_low"]:  # NaN: one seed
        return f"{row['mean']:.3f}"
    return f"{row['mean']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def write(result: dict[str, Any], folder: Path) -> None:
    (folder / "study.json").write_text(json.dumps(result, indent=1, default=float))
    (folder / "study.md").write_text(markdown(result))
    plot_curves(result, folder / "curves.png")
    plot_pass_at_k(result, folder / "pass_at_k.png")


def plot_curves(result: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    keys = [k for k in (result["metric"], *CURVES) if any(k in a["curves"] for a in result["arms"].values())]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(4.8 * max(1, len(keys)), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for name, arm in result["arms"].items():
            if key in arm["curves"]:
                c = arm["curves"][key]
                (line,) = ax.plot(c["steps"], c["mean"], marker="." if len(c["steps"]) < 12 else None, label=name)
                ax.fill_between(c["steps"], c["ci_low"], c["ci_high"], color=line.get_color(), alpha=0.2)
        ax.set_title(key)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{result['name']}: mean and 95% band over {result['seeds']} seeds")
    report.save(fig, path)


def plot_pass_at_k(result: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, arm in result["arms"].items():
        rows = sorted(((int(k.rsplit("_", 1)[1]), v) for k, v in arm["final"].items() if PASS_AT.fullmatch(k)))
        if rows:
            ks = [k for k, _ in rows]
            means = [v["mean"] for _, v in rows]
            low = [v["mean"] - v["ci_low"] if v["ci_low"] == v["ci_low"] else 0 for _, v in rows]
            high = [v["ci_high"] - v["mean"] if v["ci_high"] == v["ci_high"] else 0 for _, v in rows]
            ax.errorbar(ks, means, yerr=[low, high], marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k at the end")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("pass@k, mean and 95% interval over seeds")
    report.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    command = parser(
        "python -m orchestrator.study", __doc__, "study", "search_spaces/studies/ead_vs_fixed.yaml", "arms"
    )
    command.add_argument("--seeds", type=int, help="seeds per arm (default: study.seeds)")
    return cli(run, command, argv)


if __name__ == "__main__":
    from orchestrator.study import main as study_main  # the importable module, as the sweep (Tune pickles)

    sys.exit(study_main())
