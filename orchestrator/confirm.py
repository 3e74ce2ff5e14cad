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
from orchestrator.seeds import SeedGroup, hold_if_preempted, run_name, runs_of, seed_configs
from orchestrator.spec import ConfirmConfig, apply_overrides
from orchestrator.summary import ConfigSummary
from orchestrator.tracking import Tracker
from trainables.config import TrialConfig
from trainables.data.models import resolve_model_path

STAGE = "confirm"


def arm_steps(base: dict, arm: ConfigSummary) -> int:
    """The RL steps a confirmation run of `arm` trains: its final value's step."""
    return TrialConfig.model_validate(apply_overrides(base, arm.params)).learner.steps


def arm_runs(
    exp: Experiment, base: dict, arm: ConfigSummary, offsets: list[int], metric: str, parts: int
) -> tuple[list, list | None]:
    """One arm's runs of a look on the seeds spec seed + offsets (fresh runs, `runs_of`) and their seeds'
    MLflow runs, or ([], its values) when a resume finds the arm's record closed already. A confirmation run
    validates the base policy and its last step only: the decision reads nothing else, and validation draws
    its own seeds, so the training and the final value are those of `every: 10`."""
    steps = arm_steps(base, arm)
    cfgs = seed_configs(base, {**arm.params, "validation.every": steps}, arm.config_id, f"{exp.uri}/{STAGE}", offsets)
    tracker = Tracker(exp.tracking_uri, cfgs[0].logging.experiment)
    done = [tracker.finished_value(f"{cfg.storage.rstrip('/')}/{cfg.name}", metric, steps) for cfg in cfgs]
    if all(v is not None for v in done):  # a resume after this arm ended: its record stands, nothing restarts
        return [], [float(v) for v in done]
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
    console.print(f"confirmation: training {arm.config_id} on seeds {[cfg.seed for cfg in cfgs]}", highlight=False)
    name = f"{arm.config_id}_seeds{cfgs[0].seed}-{cfgs[-1].seed}"  # a look's seeds: runs of their own
    ids = iter(run_ids)
    return [(run, [next(ids) for _ in part], part) for run, part in runs_of(name, cfgs, parts)], None


def train_look(
    exp: Experiment, base: dict, arms: tuple[ConfigSummary, ...], offsets: list[int], metric: str, parts: int
) -> tuple[list[float], ...]:
    """The arms' values of `metric` at their last step on one look's seeds, every arm's runs at once (each
    arm's seeds over `parts` runs), as many at a time as the cluster holds."""
    planned = [arm_runs(exp, base, arm, offsets, metric, parts) for arm in arms]
    runs = [run for arm_plan, _ in planned for run in arm_plan]
    if not runs:
        return tuple(done for _, done in planned)
    cfgs = [cfg for _, _, part in runs for cfg in part]
    model_path = resolve_model_path(cfgs[0].model, cfgs[0].cache_dir)
    run_ids = [run_id for _, ids, _ in runs for run_id in ids]
    stores = [load_offline(part[0], model_path) for _, _, part in runs]
    tracker = Tracker(exp.tracking_uri, cfgs[0].logging.experiment)
    results = SeedGroup([(name, part) for name, _, part in runs], metric, lambda report: None).run(
        model_path, exp.tracking_uri, run_ids, stores, exp.stop.uri, exp.trust_unsealed
    )
    hold_if_preempted(results, tracker, run_ids, exp.stop, STAGE)  # the driver exits for a --resume
    for run_id in run_ids:
        tracker.finish(run_id, "finished")
    if any(r.get(metric) is None for r in results):
        raise ExperimentFailed(f"confirmation of {'/'.join(a.config_id for a in arms)}: a seed reported no {metric}")
    trained = iter(float(r[metric]) for r in results)
    return tuple(done or [next(trained) for _ in offsets] for (_, done) in planned)


def run_confirmation(
    exp: Experiment,
    base: dict,
    winner: ConfigSummary,
    baseline: ConfigSummary,
    confirm_cfg: ConfirmConfig,
    metric: str,
    mode: str,
    first_offset: int,
    parts: int,
) -> Confirmation:
    """Winner and baseline on the seeds spec seed + first_offset, + 1, ...: looks until one decides; a
    look trains both arms at once, each arm's seeds over half the `parts` runs a configuration takes."""
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
            pair = train_look(exp, base, (winner, baseline), offsets, metric, max(1, parts // 2))
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
