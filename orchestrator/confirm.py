"""The confirmation stage of a sweep: the search's winner and its baseline trained again on fresh seeds
that no search run used, paired seed by seed, look by look (`decisions.confirm`): an arm's seeds of one look
train in one Ray Train run, each seed its own MLflow run (tags `stage` = confirm, `config`, `seed`) under the
sweep's parent run.

A killed or SIGTERM'd driver loses nothing: `--resume` walks the same looks again; an arm whose seed runs
are all closed `finished` at their last step is read from MLflow, any other continues every seed from its
checkpoint (a finished run reports its final metrics at once), so it reaches the same values and verdict.
"""

from __future__ import annotations

from typing import Any

from orchestrator.cli import ExperimentFailed
from orchestrator.console import console, short_params
from orchestrator.decisions import Confirmation, confirm, looks
from orchestrator.experiment import RUNNING, Experiment
from orchestrator.launch import load_offline
from orchestrator.seeds import SeedGroup, hold_if_preempted, run_name, seed_configs
from orchestrator.spec import ConfirmConfig, apply_overrides
from orchestrator.summary import ConfigSummary
from orchestrator.tracking import Tracker
from trainables.config import TrialConfig
from trainables.data.models import resolve_model_path

STAGE = "confirm"


def arm_steps(base: dict, arm: ConfigSummary) -> int:
    """The RL steps a confirmation run of `arm` trains: its final value's step."""
    return TrialConfig.model_validate(apply_overrides(base, arm.params)).learner.steps


def train_arm(exp: Experiment, base: dict, arm: ConfigSummary, offsets: list[int], metric: str) -> list[float]:
    """One arm's values of `metric` at its last step, on the seeds spec seed + offsets (fresh runs). A
    confirmation run validates the base policy and its last step only: the decision reads nothing else,
    and validation draws its own seeds, so the training and the final value are those of `every: 10`."""
    steps = arm_steps(base, arm)
    cfgs = seed_configs(base, {**arm.params, "validation.every": steps}, arm.config_id, f"{exp.uri}/{STAGE}", offsets)
    tracker = Tracker(exp.tracking_uri, cfgs[0].logging.experiment)
    done = [tracker.finished_value(f"{cfg.storage.rstrip('/')}/{cfg.name}", metric, steps) for cfg in cfgs]
    if all(v is not None for v in done):  # a resume after this arm ended: its record stands, nothing restarts
        return [float(v) for v in done]
    model_path = resolve_model_path(cfgs[0].model, cfgs[0].cache_dir)
    shown = short_params(arm.params)
    tags = {"kind": "trial", "stage": STAGE, "sweep": exp.name, "config": arm.config_id, **shown}
    run_ids = [
        tracker.start_trial_run(
            cfg,
            parent_run_id=exp.parent,
            resume=True,
            tags={**tags, "seed": str(cfg.seed)},
            run_name=f"confirm {run_name(shown, cfg.seed)}",
        )
        for cfg in cfgs
    ]
    store = load_offline(cfgs[0], model_path)
    console.print(f"confirmation: training {arm.config_id} on seeds {[cfg.seed for cfg in cfgs]}", highlight=False)
    name = f"{arm.config_id}_seeds{cfgs[0].seed}-{cfgs[-1].seed}"  # a look's seeds: a run of their own
    results = SeedGroup(cfgs, metric, lambda report: None, name=name).run(
        model_path, exp.tracking_uri, run_ids, store, exp.stop.uri, exp.trust_unsealed
    )
    hold_if_preempted(results, tracker, run_ids, exp.stop, STAGE)  # the driver exits for a --resume
    for run_id in run_ids:
        tracker.finish(run_id, "finished")
    values = [r.get(metric) for r in results]
    if any(v is None for v in values):
        raise ExperimentFailed(f"confirmation of {arm.config_id}: a seed reported no {metric}")
    return [float(v) for v in values]


def run_confirmation(
    exp: Experiment,
    base: dict,
    winner: ConfigSummary,
    baseline: ConfigSummary,
    confirm_cfg: ConfirmConfig,
    metric: str,
    mode: str,
    first_offset: int,
) -> Confirmation:
    """Winner and baseline on the seeds spec seed + first_offset, + 1, ...: looks until one decides."""
    counts = looks(confirm_cfg.seeds, confirm_cfg.add, confirm_cfg.max_seeds)
    console.print(
        f"confirmation: {winner.config_id} against the baseline {baseline.config_id} on fresh seeds "
        f"(offsets from {first_offset}), looks at {counts} pairs",
        highlight=False,
        soft_wrap=True,
    )

    def train(offsets: list[int]) -> tuple[list[float], list[float]]:
        RUNNING.add(STAGE)  # SIGTERM waits for these seeds to checkpoint, as for a trial
        try:
            pair = tuple(train_arm(exp, base, arm, offsets, metric) for arm in (winner, baseline))
        finally:
            RUNNING.discard(STAGE)
        console.print(
            f"confirmation seeds {offsets}: {winner.config_id} "
            + " ".join(f"{v:.3f}" for v in pair[0])
            + "; baseline "
            + " ".join(f"{v:.3f}" for v in pair[1]),
            highlight=False,
            soft_wrap=True,
        )
        return pair

    return confirm(train, first_offset, counts, confirm_cfg.alpha, confirm_cfg.margin, mode, confirm_cfg.spending)


def describe(result: Confirmation, cfg: ConfirmConfig, metric: str) -> str:
    """One line: the confirmed difference, its verdict, and the sequential rule's error bound."""
    look, n = result.look, len(result.diffs)
    level = 1 - look.alpha
    outcome = {
        "better": "better than the baseline",
        "worse": "worse than the baseline",
        "equivalent": f"equivalent to the baseline within +-{cfg.margin:g}" if cfg.margin else "equivalent",
        "inconclusive": f"inconclusive at {n} seed pairs",
    }[look.verdict]
    interval = f"{look.mean:+.3f} [{look.low:+.3f}, {look.high:+.3f}]"
    return (
        f"confirmed on fresh seeds: winner - baseline ({metric}) = {interval} ({level:.2%} interval, this look's "
        f"share of alpha): {outcome}; sequential rule: looks at {result.counts} pairs, {cfg.spending} alpha "
        f"spending, P(a false verdict) <= {cfg.alpha:g} over all looks"
    )


def metrics(result: Confirmation) -> dict[str, Any]:
    look = result.look
    return {
        "confirm/best_minus_baseline/mean": look.mean,
        "confirm/best_minus_baseline/ci_low": look.low,
        "confirm/best_minus_baseline/ci_high": look.high,
        "confirm/seeds": len(result.seeds),
        "confirm/alpha_at_look": look.alpha,
    }
