"""The report's opening (orchestrator/report.py): the sweep's answer, then the confirmation that decided it,
read back from MLflow: the parent run's verdict and tags, the confirmation's seed runs (tag `stage` =
confirm) paired by seed, and each look's interval recomputed by the rule that made it (`decisions.confirm_step`
at the spec's `search.confirm`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from orchestrator.decisions import Look, confirm_step, looks
from orchestrator.spec import ConfirmConfig

STAGE = "confirm"  # orchestrator/confirm.py's tag


def answer_lines(anchor, folder: Path) -> list[str]:
    """`## Answer`: the verdict in words (the parent run's description, the deciding stage first) and the
    configuration the final model trains; nothing before the sweep has ended."""
    tags = anchor.data.tags
    verdict = tags.get("mlflow.note.content", "").strip()
    if tags.get("state") != "finished" or not verdict:
        return []
    lines = ["## Answer", "", verdict, ""]
    if final := tags.get("best_trial"):
        lines += [f"The final model trains `{final}`: `python -m orchestrator.train --best-of {folder}`.", ""]
    return lines


def confirm_config(client, anchor) -> ConfirmConfig | None:
    """The sweep's `search.confirm`, from the search.yaml its parent run keeps."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            search = yaml.safe_load(Path(client.download_artifacts(anchor.info.run_id, "search.yaml", tmp)).read_text())
        except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
            return None
    raw = (search or {}).get("confirm")
    return ConfirmConfig.model_validate(raw) if isinstance(raw, dict) else None


def pairs(runs: list, winner: str, baseline: str, metric: str) -> list[tuple[int, float, float]]:
    """(seed, the winner's final value, the baseline's) for every seed both arms finished, in seed order."""
    values: dict[int, dict[str, float]] = {}
    for run in runs:
        if run.data.tags.get("stage") == STAGE and metric in run.data.metrics:
            seed, config = int(run.data.tags.get("seed", -1)), run.data.tags.get("config")
            values.setdefault(seed, {})[config] = run.data.metrics[metric]
    return [(seed, v[winner], v[baseline]) for seed, v in sorted(values.items()) if winner in v and baseline in v]


def look_results(diffs: list[float], cfg: ConfirmConfig, mode: str) -> list[Look]:
    """Each look the confirmation reached, as `decisions.confirm_step` decided it."""
    counts = looks(cfg.seeds, cfg.add, cfg.max_seeds)
    return [
        confirm_step(diffs[:n], counts, cfg.alpha, cfg.margin, mode, cfg.spending) for n in counts if n <= len(diffs)
    ]


def confirmation_lines(
    found: list[tuple[int, float, float]], reached: list[Look], winner: str, baseline: str, metric: str
) -> list[str]:
    """`## Confirmation`: each pair's values and difference, each look's interval at its share of alpha."""
    lines = [
        f"## Confirmation: {winner} against the baseline {baseline} on fresh seeds ({metric})",
        "",
        "| seed | winner | baseline | difference |",
        "|---|---|---|---|",
    ]
    lines += [f"| {seed} | {w:.4f} | {b:.4f} | {w - b:+.4f} |" for seed, w, b in found]
    lines += [
        "",
        "| look (pairs) | its share of alpha | mean difference | interval | verdict |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {look.n} | {look.alpha:.4f} | {look.mean:+.4f} | [{look.low:+.4f}, {look.high:+.4f}] | {look.verdict} |"
        for look in reached
    ]
    return [*lines, "", "![confirmation](confirmation.png)", ""]


def plot_confirmation(found: list[tuple[int, float, float]], reached: list[Look], path: Path, plt) -> None:
    """The paired differences by seed, and each look's interval beside them."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.plot(range(len(found)), [w - b for _, w, b in found], "o", label="winner - baseline, one seed pair")
    for i, look in enumerate(reached):
        x = len(found) + i + 0.5
        ax.errorbar(
            [x],
            [look.mean],
            yerr=[[look.mean - look.low], [look.high - look.mean]],
            fmt="s",
            capsize=4,
            label=f"look at {look.n} pairs: {look.verdict}",
        )
    ax.set_xticks(
        [*range(len(found)), *(len(found) + i + 0.5 for i in range(len(reached)))],
        [*(str(seed) for seed, _, _ in found), *(f"{look.n} pairs" for look in reached)],
    )
    ax.set_xlabel("seed pair; then each look")
    ax.set_ylabel("difference")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def confirmation_section(client, anchor, runs: list, metric: str, mode: str, report: Path, plt) -> list[str]:
    """The confirmation's lines (its plot written into `report`); nothing where none ran."""
    tags = anchor.data.tags
    winner, baseline = tags.get("verdict_config"), tags.get("baseline")
    cfg = confirm_config(client, anchor)
    if tags.get("verdict_stage") != STAGE or not (winner and baseline and cfg):
        return []
    found = pairs(runs, winner, baseline, metric)
    reached = look_results([w - b for _, w, b in found], cfg, mode)
    if not reached:
        return []
    plot_confirmation(found, reached, report / "confirmation.png", plt)
    return confirmation_lines(found, reached, winner, baseline, metric)
