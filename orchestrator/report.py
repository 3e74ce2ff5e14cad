"""python -m orchestrator.report SWEEP_OR_TRIAL [--out DIR] [--tracking-uri URI]

A folder of PNG plots and a Markdown summary of a sweep (<storage>/<name>) or one trial's run
(<storage>/<name>), read back from MLflow (and the sweep's Optuna study), and logged as artifacts of
the sweep's (or trial's) run:

    curves.png              reward, accuracy, policy entropy, response length against step, per trial
                            (smoothed, the raw per-step values faint behind)
    validation.png          val/accuracy (and a val/* objective) against step, per trial
    oger_exploration.png    OGER's exploration reward, mean and max, against step (oger* trials)
    temperature.png         each trial's decoding temperature against token position, first and last step
    pass_at_k.png           pass@k against k from the trials' evaluations (orchestrator.evaluate)
    objective.png           the objective against each searched parameter (sweeps)
    importance.png          Optuna's parameter importances (sweeps with enough finished trials)
    confirmation.png        the confirmation's paired differences and each look's interval (sweeps that confirmed)
    report.md               the answer first (orchestrator/answer.py), the confirmation, then the selection:
                            its configurations, every run with its stage, importances
    report.html             report.md with its plots inside: what MLflow's artifact view shows
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from orchestrator import answer
from orchestrator.console import console, roles, short_params
from orchestrator.inputs import check_tracking_uri
from orchestrator.spec import SpecError
from orchestrator.stats import seed_interval
from orchestrator.tracking import default_tracking_uri, open_store, unflatten
from trainables.config import DecodingConfig
from trainables.evaluation import mean_pass_at_k
from trainables.rollout.ead import SCHEDULES

CURVES = ("rollout/reward_mean", "rollout/accuracy", "policy/entropy", "rollout/response_length")
SMOOTHING = 0.6  # TensorBoard's default weight
SMOOTH_FROM = 10  # points: shorter curves (validations) are drawn raw


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def find_runs(client: MlflowClient, experiment: str, folder: Path) -> tuple[object, list, str | None, list]:
    """(the run to attach the report to, the search's trial runs, the sweep name or None, the confirmation's
    runs)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SpecError(f"no MLflow experiment {experiment!r} in {client.tracking_uri}")
    runs = client.search_runs([found.experiment_id], max_results=10_000)
    sweep = [r for r in runs if r.data.tags.get("kind") == "sweep" and r.data.tags.get("sweep") == folder.name]
    if (folder / "tune").is_dir() and sweep:
        ours = (r for r in runs if r.data.tags.get("kind") == "trial" and r.data.tags.get("sweep") == folder.name)
        runs = sorted(ours, key=lambda r: r.info.start_time)
        confirming = [r for r in runs if r.data.tags.get("stage") == answer.STAGE]
        return sweep[0], [r for r in runs if r not in confirming], folder.name, confirming
    trial = [r for r in runs if r.data.tags.get("run_path") == str(folder)]
    if not trial:
        raise SpecError(f"SWEEP_OR_TRIAL: no sweep or trial run for {folder} in {client.tracking_uri}")
    return trial[0], trial[:1], None, []


def history(client: MlflowClient, run, key: str) -> tuple[list[int], list[float]]:
    points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    return [s for s, _ in points], [v for _, v in points]


def label(run, keys: list[str]) -> str:
    """A trial's legend entry: its run name when that says what differs (`tau_max=1.25 seed=1`), else the
    name with the searched parameters to 3 significant digits."""
    if "=" in run.info.run_name or not keys:
        return run.info.run_name
    params = short_params({k: run.data.params.get(k) for k in keys})
    return f"{run.info.run_name} ({', '.join(f'{k}={v}' for k, v in params.items())})"


def with_base(run, key: str, steps: list[int], values: list[float]) -> tuple[list[int], list[float]]:
    """The curve with the base policy's validation (logged as `<key>_base`) as its step 0."""
    if f"{key}_base" in run.data.metrics and 0 not in steps:
        return [0, *steps], [run.data.metrics[f"{key}_base"], *values]
    return steps, values


def smoothed(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's debiased exponential moving average: s_t = w s_(t-1) + (1 - w) x_t, shown as s_t / (1 - w^t)."""
    out, s = [], 0.0
    for t, x in enumerate(values, 1):
        s = weight * s + (1 - weight) * x
        out.append(s / (1 - weight**t))
    return out


def plot_metrics(client, trials, keys: tuple[str, ...], searched: list[str], path: Path, title: str) -> bool:
    """A panel per metric (two to a row), a line per trial: a colour per configuration, a line style per
    seed, pruned trials marked x; curves of SMOOTH_FROM points or more smoothed over their faint raw
    values; the base validation as step 0; the legend below the panels.
    False (no file) when no trial has any of the metrics."""
    plt = pyplot()
    curves = {k: [history(client, run, k) for run in trials] for k in keys if any(k in r.data.metrics for r in trials)}
    if not curves:
        return False
    titles = panel_titles(curves)
    present = list(titles)
    columns = min(2, len(present))
    rows = -(-len(present) // columns)
    height = 3.8 * rows
    fig, axes = plt.subplots(rows, columns, figsize=(12.8, height), squeeze=False)
    configs = list(dict.fromkeys(r.data.tags.get("config", r.info.run_name) for r in trials))
    styles = ["-", "--", "-.", ":"]
    for ax, key in zip(axes.flat, present):
        seen: dict[str, int] = {}
        for run, curve in zip(trials, curves[key]):
            config = run.data.tags.get("config", run.info.run_name)
            seen[config] = seen.get(config, 0) + 1
            steps, values = with_base(run, key, *curve)
            pruned = run.data.tags.get("state") == "pruned"
            color, style = f"C{configs.index(config) % 10}", styles[(seen[config] - 1) % 4]
            if len(steps) >= SMOOTH_FROM:  # noisy per-step values: faint, under their smoothed curve
                ax.plot(steps, values, color=color, linestyle=style, linewidth=0.7, alpha=0.25)
                values = smoothed(values)
            ax.plot(
                steps,
                values,
                color=color,
                linestyle=style,
                marker="x" if pruned else ("." if len(steps) < 40 else None),
                markevery=[len(steps) - 1] if pruned and len(steps) >= SMOOTH_FROM else None,
                label=label(run, searched) + (" (pruned)" if pruned else ""),
            )
        ax.set_title(titles[key], fontsize=10)
        ax.set_xlabel("RL step")
        ax.set_ylabel(key.rsplit("/", 1)[-1])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=7, frameon=False)
    fig.suptitle(title)
    legend_inches = 0.45 + 0.16 * -(-len(labels) // 3)  # below the panels, clear of the x-axis labels
    fig.tight_layout(rect=(0, legend_inches / (height + legend_inches), 1, 1))
    fig.set_figheight(height + legend_inches)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def panel_titles(curves: dict[str, list]) -> dict[str, str]:
    """One panel per distinct series: a metric whose every trial's curve equals an earlier one's (GRPO's
    reward is its accuracy) shares that panel, named in its title. curves: {key: [(steps, values)] per trial}."""
    titles: dict[str, str] = {}
    for key, curve in curves.items():
        same = next((k for k in titles if curves[k] == curve), None)
        if same is None:
            titles[key] = key
        else:
            titles[same] += f" = {key}"
    return titles


def by_config(trials) -> dict[str, list]:
    """Configuration -> its seed runs, in the order they come (a run without the tag stands alone)."""
    configs: dict[str, list] = {}
    for run in trials:
        configs.setdefault(run.data.tags.get("config", run.info.run_name), []).append(run)
    return configs


def legend_marks(tags: dict[str, str]) -> dict[str, str]:
    """Configuration -> what the sweep made of it: the baseline, the selection's best, the final model's."""
    return roles(tags.get("baseline"), tags.get("selected_best"), tags.get("best_trial"))


def plot_configurations(
    client, trials, keys: tuple[str, ...], searched: list[str], marks: dict[str, str], path: Path, title: str
) -> bool:
    """A panel per metric, a line per configuration: the mean over its seeds at each step every seed
    reached, from the base policy (step 0), its 95% interval over seeds as a band (none for one seed);
    `marks` labels configurations in the legend (baseline, best), a pruned one's end is marked x; the
    legend below the panels. False (no file) when no trial has any of the metrics."""
    plt = pyplot()
    present = [k for k in keys if any(k in r.data.metrics for r in trials)]
    if not present:
        return False
    configs = by_config(trials)
    fig, axes = plt.subplots(1, len(present), figsize=(max(6.5, 5.6 * len(present)), 4.2), squeeze=False)
    for ax, key in zip(axes.flat, present):
        for i, (config, runs) in enumerate(configs.items()):
            per_seed = [dict(zip(*with_base(run, key, *history(client, run, key)))) for run in runs]
            steps = sorted(set.intersection(*(set(h) for h in per_seed)))
            if not steps:
                continue
            intervals = [seed_interval([h[s] for h in per_seed]) for s in steps]
            pruned = any(r.data.tags.get("state") == "pruned" for r in runs)
            params = " ".join(
                f"{k}={v}" for k, v in short_params({k: runs[0].data.params.get(k) for k in searched}).items()
            )
            name = ", ".join(
                filter(None, [config, params, f"{len(runs)} seed(s)", marks.get(config), "pruned" if pruned else ""])
            )
            color = f"C{i % 10}"
            ax.plot(steps, [iv.mean for iv in intervals], color=color, marker=".", label=name)
            if all(math.isfinite(iv.low) for iv in intervals):
                ax.fill_between(
                    steps,
                    [iv.low for iv in intervals],
                    [iv.high for iv in intervals],
                    color=color,
                    alpha=0.15,
                    linewidth=0,
                )
            if pruned:
                ax.plot(steps[-1], intervals[-1].mean, "x", color=color, markersize=10, markeredgewidth=2)
        ax.set_title(f"{key}: mean over seeds, 95% band", fontsize=10)
        ax.set_xlabel("RL step (0: the base policy)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=8, frameon=False)  # below: clear of the data
    fig.suptitle(title)
    legend_inches = 0.3 + 0.17 * len(labels)
    fig.set_figheight(4.2 + legend_inches)
    fig.tight_layout(rect=(0, legend_inches / (4.2 + legend_inches), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_temperatures(trials, searched: list[str], path: Path) -> None:
    """EAD paper, Fig. 1: the temperature each token position is decoded at, at the first and the last
    RL step (EAD's s: 1 at the first rollout). One pair of lines per configuration (its seeds decode
    alike), to its last step; the legend below the axes."""
    plt = pyplot()
    configs = by_config(trials)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (config, runs) in enumerate(configs.items()):
        p = runs[0].data.params
        decoding = DecodingConfig.model_validate(unflatten(p, "rollout.decoding."))
        positions = torch.arange(int(p.get("rollout.max_new_tokens", 64)))
        last = max(int(r.data.metrics.get("progress/step", 1)) for r in runs)  # where it stopped (the scheduler)
        params = " ".join(f"{k}={v}" for k, v in short_params({k: p.get(k) for k in searched}).items())
        name = params if len(configs) > 1 and params else label(runs[0], searched)
        for step, style in ((1, "-"), (last, "--")):
            ax.plot(
                positions,
                SCHEDULES[decoding.schedule](positions, step, **decoding.schedule_params()),
                style,
                color=f"C{i % 10}",
                label=f"{name}, step {step}",
            )
    ax.set_xlabel("token position t")
    ax.set_ylabel("temperature")
    ax.set_title("decoding temperature (solid: first step, dashed: last)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    legend_inches = 0.3 + 0.15 * -(-len(labels) // 2)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)  # below: clear of the lines
    fig.set_figheight(3.8 + legend_inches)
    fig.tight_layout(rect=(0, legend_inches / (3.8 + legend_inches), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluations(client, trials, experiment_id: str) -> list[tuple[str, dict]]:
    """(trial name, evaluation JSON) of every evaluation run nested under the trials."""
    names = {r.info.run_id: r.info.run_name for r in trials}
    runs = client.search_runs([experiment_id], "tags.kind = 'evaluation'", max_results=10_000)
    out = []
    for run in runs:
        parent = run.data.tags.get("mlflow.parentRunId")
        if parent not in names:
            continue
        for artifact in client.list_artifacts(run.info.run_id):
            if artifact.path.endswith(".json"):
                with tempfile.TemporaryDirectory() as tmp:
                    local = client.download_artifacts(run.info.run_id, artifact.path, tmp)
                    out.append((names[parent], json.loads(Path(local).read_text())))
    return out


def plot_pass_at_k(evals: list[tuple[str, dict]], path: Path) -> bool:
    """OGER paper, Fig. 4: pass@k against k, per trial, decoding and benchmark."""
    plt = pyplot()
    if not evals:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for trial, record in evals:
        for decoding, per_benchmark in record["problems"].items():
            for bench, problems in per_benchmark.items():
                correct = [p["correct"] for p in problems]
                n = min(len(c) for c in correct)
                ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
                ax.plot(ks, [mean_pass_at_k(correct, k) for k in ks], marker="o", label=f"{trial} {decoding} {bench}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    save(fig, path)
    return True


def study_of(folder: Path, sweep: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = folder / "optuna.db"
    return optuna.load_study(study_name=sweep, storage=f"sqlite:///{db}") if db.is_file() else None


def plot_objective(trials, searched: list[str], metric: str, path: Path, log: set[str] = frozenset()) -> bool:
    """The objective against each searched parameter, a point per trial; `log`: those searched on a log scale."""
    plt = pyplot()
    values = [(run, run.data.metrics.get(metric)) for run in trials]
    values = [(run, v) for run, v in values if v is not None]
    if not searched or not values:
        return False
    fig, axes = plt.subplots(1, len(searched), figsize=(4.2 * len(searched), 3.4), squeeze=False)
    for ax, key in zip(axes[0], searched):
        xs = [run.data.params.get(key) for run, _ in values]
        try:
            xs = [float(x) for x in xs]
        except (TypeError, ValueError):
            pass  # a categorical parameter: matplotlib places the strings
        pruned = [run.data.tags.get("state") == "pruned" for run, _ in values]
        for marked, style in (
            (False, {"label": "ran to the end"}),
            (True, {"label": "pruned (an earlier step)", "marker": "x", "color": "tab:red"}),
        ):
            points = [(x, v) for x, (_, v), p in zip(xs, values, pruned) if p == marked]
            if points:
                ax.scatter(*zip(*points), **style)
        ax.set_title(f"{metric} against {key.rsplit('.', 1)[-1]}", fontsize=9)
        ax.legend(fontsize=7)
        ax.set_xlabel(key + (" (log scale, as searched)" if key in log else ""))
        if key in log:
            ax.set_xscale("log")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    save(fig, path)
    return True


def importances(study) -> dict[str, float]:
    """Optuna's fANOVA importances, or {} when the study cannot rank its parameters yet."""
    import optuna

    try:
        with warnings.catch_warnings():  # "too few trials": the report says how many it rests on
            warnings.simplefilter("ignore", UserWarning)
            return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError):  # fewer than two finished trials, or one value everywhere
        return {}


def plot_importance(values: dict[str, float], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.5 * len(values)))
    ax.barh(list(values), list(values.values()))
    ax.set_xlabel("importance (fANOVA)")
    ax.set_title(
        "parameter importance over the trials that ran to the end\n(Optuna's fANOVA: few trials, a rough guide)",
        fontsize=9,
    )
    ax.invert_yaxis()
    save(fig, path)


def save(fig, path: Path) -> None:
    plt = pyplot()
    with warnings.catch_warnings():  # a legend that leaves no margin is drawn as it is, without a warning
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(
    title: str,
    trials,
    searched: list[str],
    metrics: tuple[str, ...],
    images: list[str],
    importance: dict[str, float],
    notes: list[str],
    configurations: str | None = None,
    importance_over: int = 0,
    opening: list[str] = (),
) -> str:
    """report.md: `opening` (the answer and the confirmation) first, then the selection; `importance_over`: how
    many configurations that ran to the end the importances rest on."""
    lines = [f"# {title}", "", *opening]
    if configurations:
        lines += [
            "## Selection: each configuration's mean and 95% interval over seeds",
            "",
            configurations.strip(),
            "",
            "## Runs (one per configuration, seed and stage)",
            "",
        ]
    columns = ["trial", "stage", "state", "steps", *metrics, *short_params(dict.fromkeys(searched, 0))]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for run in trials:
        m = run.data.metrics
        row = [
            run.info.run_name,
            run.data.tags.get("stage", "-"),
            run.data.tags.get("state", "?"),
            f"{m.get('progress/step', 0):.0f}",
            *[f"{m[key]:.4f}" if key in m else "-" for key in metrics],
            *short_params({k: run.data.params.get(k, "-") for k in searched}).values(),
        ]
        lines.append("| " + " | ".join(row) + " |")
    if importance:
        lines += [
            "",
            "## Parameter importance (Optuna, fANOVA)",
            "",
            f"Over the {importance_over} configuration(s) that ran to the end: with few, a rough guide.",
            "",
            "| parameter | importance |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.3f} |" for k, v in importance.items()]
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in images if f"]({name})" not in "\n".join(opening)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def html_page(text: str, folder: Path) -> str:
    """report.md as one HTML page with its plots inline: MLflow's artifact view renders HTML (in a
    sandboxed frame that cannot follow a relative link), and shows Markdown as plain text."""
    from markdown import markdown as to_html

    def inline(match: re.Match) -> str:
        return f'src="data:image/png;base64,{base64.b64encode((folder / match[1]).read_bytes()).decode()}"'

    body = re.sub(r'src="([\w.-]+\.png)"', inline, to_html(text, extensions=["tables"]))
    style = (
        "body{font-family:sans-serif;max-width:1300px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}img{max-width:100%}"
    )
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{body}</body></html>\n"


def sweep_table(client: MlflowClient, anchor) -> str | None:
    """The sweep's table of configurations and its verdict, as the sweep logged them (None before it ends)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            return Path(client.download_artifacts(anchor.info.run_id, "configurations.md", folder)).read_text()
        except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
            return None


def draw_plots(
    client,
    anchor,
    trials: list,
    study,
    sweep: str | None,
    metric: str,
    shown: tuple[str, ...],
    report: Path,
    title: str,
) -> tuple[list[str], list[str], dict[str, float]]:
    """The report's plots in `report`: (their file names, notes on plots it could not draw, the parameters'
    importance)."""
    searched = sorted({k for t in study.trials for k in t.params}) if study else []
    images, notes = [], []
    if plot_metrics(client, trials, CURVES, searched, report / "curves.png", title):
        images.append("curves.png")
    validation = tuple(m for m in shown if m.startswith("val/"))
    marks = legend_marks(anchor.data.tags) if sweep else {}
    if plot_configurations(client, trials, validation, searched, marks, report / "validation.png", title):
        images.append("validation.png")
    if plot_metrics(
        client,
        trials,
        ("oger/exploration_mean", "oger/exploration_max"),
        searched,
        report / "oger_exploration.png",
        "OGER exploration reward",
    ):
        images.append("oger_exploration.png")
    plot_temperatures(trials, searched, report / "temperature.png")
    images.append("temperature.png")
    if plot_pass_at_k(evaluations(client, trials, anchor.info.experiment_id), report / "pass_at_k.png"):
        images.append("pass_at_k.png")
    else:
        notes.append("no evaluation yet: run python -m orchestrator.evaluate on a trial for pass@k curves")
    importance = importances(study) if study else {}
    logged = (
        {k for t in study.trials for k, d in t.distributions.items() if getattr(d, "log", False)} if study else set()
    )
    if sweep and plot_objective(trials, searched, metric, report / "objective.png", logged):
        images.append("objective.png")
    if importance:
        plot_importance(importance, report / "importance.png")
        images.append("importance.png")
    elif sweep:
        notes.append("parameter importance needs at least two finished trials with different settings")
    return images, notes, importance


def run(target: str, out: str | None, tracking_uri: str | None, experiment: str) -> Path:
    folder = Path(target).expanduser().resolve()
    if not folder.is_dir():
        raise SpecError(f"SWEEP_OR_TRIAL: {folder} is not a folder (a sweep's <storage>/<name> or a trial's)")
    client = open_store(tracking_uri or default_tracking_uri(str(folder.parent)))
    anchor, trials, sweep, confirming = find_runs(client, experiment, folder)
    study = study_of(folder, sweep) if sweep else None
    searched = sorted({k for t in study.trials for k in t.params}) if study else []
    params = anchor.data.params
    metric = (params.get("search.metric") or params.get("study.metric")) if sweep else "val/accuracy"
    report = Path(out).resolve() if out else folder / "report"
    report.mkdir(parents=True, exist_ok=True)
    title = f"sweep {sweep}" if sweep else f"trial {anchor.info.run_name}"
    shown = tuple(dict.fromkeys(filter(None, (metric, "val/accuracy"))))  # the objective first
    images, notes, importance = draw_plots(client, anchor, trials, study, sweep, metric, shown, report, title)
    configurations = sweep_table(client, anchor) if sweep else None
    finished = sum(t.state.name == "COMPLETE" for t in study.trials) if study else 0
    opening = answer.answer_lines(anchor, folder) if sweep else []
    if sweep and (
        confirmed := answer.confirmation_section(
            client, anchor, confirming, metric, params.get("search.mode", "max"), report, pyplot()
        )
    ):
        opening += confirmed
        images.append("confirmation.png")
    text = markdown(
        title, [*trials, *confirming], searched, shown, images, importance, notes, configurations, finished, opening
    )
    (report / "report.md").write_text(text)
    (report / "report.html").write_text(html_page(text, report))
    client.log_artifacts(anchor.info.run_id, str(report), "report")
    console.print(
        f"report: {report / 'report.html'} and report.md ({len(images)} plots; also in MLflow run "
        f"{anchor.info.run_id})",
        soft_wrap=True,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.report",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="SWEEP_OR_TRIAL", help="a sweep's or a trial's folder, <storage>/<name>")
    parser.add_argument("--out", help="report folder (default: SWEEP_OR_TRIAL/report)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite in the storage folder)")
    parser.add_argument("--experiment", default="rlvr-explore", help="MLflow experiment")
    args = parser.parse_args(argv)
    try:
        if args.tracking_uri is not None:
            check_tracking_uri(args.tracking_uri, "--tracking-uri")
        run(args.target, args.out, args.tracking_uri, args.experiment)
    except SpecError as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
