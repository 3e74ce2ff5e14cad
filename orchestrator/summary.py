"""What a sweep or a study concludes from its configurations: each one's summary at its end (state,
steps, per-seed objective, 95% interval), the comparison of two (paired seed by seed, refused where
their values come from different steps or validations), the noise split and the Markdown table."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.console import short_params
from orchestrator.decisions import pooled_sd
from orchestrator.seeds import SE_KEY, ended
from orchestrator.stats import Interval, describe, paired_difference, seed_interval, seeds_needed, seeds_range, verdict


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


def summarize(
    results, metric: str, keys: list[str], uri: str | None = None, seeds_of: Callable[[str], list] | None = None
) -> list[ConfigSummary]:
    """Every configuration of a ResultGrid, in the order Tune made them. One that ended short of its last
    step is read from durable records (`seeds.outcome`): the scheduler's stops under `uri`, and
    `seeds_of(config_id)`, its seed runs' own (steps, learner.steps, objective), where Tune lost its last
    report."""
    out = []
    for r in results:
        m, config_id = dict(r.metrics or {}), trial_id_of(r)
        values = [
            m[k]
            for k in sorted(
                (k for k in m if k.startswith("seeds/") and k.endswith(f"/{metric}")),
                key=lambda k: int(k.split("/")[1]),
            )
        ]
        steps, state = int(m.get("progress/step", 0)), "errored" if r.error else "finished"
        if not r.error:
            state, _, seeds = ended(m, uri, config_id, seeds_of)
            if seeds and state == "finished":
                values, steps = [v for _, _, v in seeds], seeds[0][1]
        se = m.get(SE_KEY)
        values = [v for v in values if v is not None]
        out.append(
            ConfigSummary(
                config_id,
                {k: (r.config or {}).get(k) for k in keys},
                state,
                steps,
                values,
                seed_interval(values, se) if values else None,
                se,
                m,
            )
        )
    return out


def trial_id_of(result) -> str:
    """A Tune result's trial id: reported with every result, else from its folder (`trainable_<id>_<n>_...`)."""
    if (result.metrics or {}).get("trial_id"):
        return result.metrics["trial_id"]
    name = result.path.rstrip("/").rsplit("/", 1)[-1]
    return name.split("_")[1] if name.startswith("trainable_") else name


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
MEASUREMENT = (
    "validation.",
    "task.name",
    "task.levels",
    "task.val_size",
    "task.seed",
    "prompt.",
    "rollout.max_new_tokens",
)


def incomparable(a_params: dict[str, Any], b_params: dict[str, Any], a_steps, b_steps) -> str | None:
    """Why two sides' objectives cannot be paired (their values come from different steps, or from
    different validations), or None. Params: each side's overrides of the common spec."""
    if a_steps != b_steps:
        return f"their values come from different steps ({a_steps} and {b_steps})"
    differ = sorted(
        k for k in a_params.keys() | b_params.keys() if k.startswith(MEASUREMENT) and a_params.get(k) != b_params.get(k)
    )
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
    return Comparison(
        diff, verdict(diff, mode), seeds_needed(diffs) if seeds else None, seeds_range(diffs) if seeds else None
    )


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
    parts = [
        f"validation standard error of {metric}: {sum(se) / len(se):.3f} (its problems and samples)"
        if se
        else f"no standard error reported for {metric}"
    ]
    parts.append(
        f"seed-to-seed SD: {sd:.3f} (measurement and training together)"
        if sd is not None
        else "one seed per configuration: the intervals ignore seed noise"
    )
    return "; ".join(parts)


def markdown_table(
    summaries: list[ConfigSummary], metric: str, keys: list[str], names: dict[str, str] | None = None
) -> str:
    """The configurations as a Markdown table: state, steps, mean and 95% interval, each seed's value."""
    header = [
        "configuration",
        "state",
        "steps",
        f"{metric} mean [95% CI]",
        "seeds",
        "val SE",
        *short_params(dict.fromkeys(keys, 0)),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        name = (names or {}).get(s.config_id, s.config_id)
        seeds = ", ".join(f"{v:.3f}" for v in s.values) or "-"
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    s.state,
                    str(s.steps),
                    s.interval.format() if s.interval else "-",
                    seeds,
                    f"{s.se:.3f}" if s.se is not None else "-",
                    *short_params({k: s.params.get(k) for k in keys}).values(),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"
