"""`python -m bench decisions`: the sweep's decision procedure run many times on simulated
configurations whose true means are known, so that its error rates are measured, not assumed.

Each simulated sweep runs the sweep's own decision code: its reports are built by `seeds.group_metrics`
at each validation, its scheduler is `sweep.make_scheduler` (Ray's ASHA for the old procedure, the
noise-aware rungs for the new), the winner and the selection's verdict come from `sweep.ranked` and
`sweep.verdict_against_baseline`, and the new procedure's verdict from `decisions.confirm` on fresh
simulated seeds. Configurations run one at a time (the default's max_concurrent_trials: 1).

The noise, calibrated on this project's runs (docs/science.md): the base policy at 0.21, a validation
every 10 of 30 steps with its own standard error 0.019 at every validation, each (configuration, seed)
a persistent training effect growing with the curve, so that the seed-to-seed SD at step 30 is
`sd` (0.02-0.06 measured); curves rise as 1 - exp(-step / 12), as the measured validations do.
Scenarios: all equal; one configuration better by 1 and by 2 seed SDs; a ladder (+0, +0.5, +1, +1.5
SDs). The baseline (the first configuration) is never the better one, except where all are equal.
"""

from __future__ import annotations

import math
import types
import zlib
from dataclasses import dataclass

import numpy as np

from orchestrator import decisions
from orchestrator.summary import ConfigSummary
from orchestrator.seeds import group_metrics
from orchestrator.spec import SearchConfig
from orchestrator.stats import seed_interval
from trainables.config import VAL_STEP

METRIC = "val/accuracy"
STEPS, EVERY, BASE, FINAL, VAL_SE, TAU = 30, 10, 0.21, 0.40, 0.019, 12.0
SPACE = {"x": {"uniform": [0.0, 1.0]}}

# Today's procedure as the shipped spec had it, and the new default (search_spaces/ead.yaml).
PROCEDURES = {
    "old: 3 seeds, ASHA, verdict on the selection seeds": {
        "seeds": 3, "scheduler": {"name": "asha", "grace_period": 10, "reduction_factor": 2}},
    "new: 2 seeds, interval rungs, confirmation on fresh seeds": {
        "seeds": 2, "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 6}},
    "new, Pocock-type spending": {
        "seeds": 2, "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 6, "spending": "pocock"}},
    "new, confirmation up to 10 pairs": {
        "seeds": 2, "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 10}},
}
NEW = "new: 2 seeds, interval rungs, confirmation on fresh seeds"


def scenarios(sd: float) -> dict[str, list[float]]:
    """True final means of the four configurations, the baseline first."""
    return {"all equal": [FINAL] * 4,
            "one better by 1 SD": [FINAL, FINAL, FINAL + sd, FINAL],
            "one better by 2 SDs": [FINAL, FINAL, FINAL + 2 * sd, FINAL],
            "ladder (+0.5 SD each)": [FINAL + k * sd / 2 for k in range(4)]}


def shape(step: int) -> float:
    """How far along its curve a run is at `step`: 0 at the base policy, 1 at the last step."""
    return (1 - math.exp(-step / TAU)) / (1 - math.exp(-STEPS / TAU))


class World:
    """Draws validation values: a persistent effect per (configuration, seed) growing with the curve,
    and fresh measurement noise at every validation."""

    def __init__(self, rng: np.random.Generator, sd: float):
        self.rng, self.train_sd = rng, math.sqrt(max(sd**2 - VAL_SE**2, 0.0))

    def run(self, final: float, seeds: int) -> dict[int, list[float]]:
        """step -> per-seed values at each validation of `seeds` fresh seeds."""
        effects = self.rng.normal(0, self.train_sd, seeds)
        return {step: [BASE + (final - BASE + e) * shape(step) + self.rng.normal(0, VAL_SE) for e in effects]
                for step in range(EVERY, STEPS + 1, EVERY)}

    def finals(self, final: float, seeds: list[int]) -> list[float]:
        return self.run(final, len(seeds))[STEPS]


def report(values: list[float], step: int) -> dict:
    """A configuration's report at a validation step, as the sweep's SeedGroup builds it."""
    reports = [{METRIC: v, "val/accuracy_se": VAL_SE} for v in values]
    return {**group_metrics(reports, METRIC), "progress/step": step, VAL_STEP: step, "progress/steps": STEPS}


@dataclass
class Outcome:
    verdict: str
    challenger: int | None  # index of the configuration compared with the baseline
    pruned: set[int]
    trial_steps: int


def select(search: SearchConfig, means: list[float], world: World) -> tuple[list[ConfigSummary], set[int], int]:
    """Run the configurations one at a time through the sweep's scheduler: their summaries, the pruned
    ones, and the trial-steps spent."""
    from orchestrator.sweep import make_scheduler

    scheduler = make_scheduler(search, STEPS)
    scheduler.set_search_properties(METRIC, search.mode)
    summaries, pruned, spent = [], set(), 0
    for i, mean in enumerate(means):
        trial = types.SimpleNamespace(trial_id=str(i))
        scheduler.on_trial_add(None, trial)
        history, last = world.run(mean, search.seeds), STEPS
        for step, values in history.items():
            if scheduler.on_trial_result(None, trial, report(values, step)) == "STOP" and step < STEPS:
                pruned.add(i)
                last = step
                break
        values = history[last]
        spent += last * search.seeds
        summaries.append(ConfigSummary(str(i), {"x": i}, "finished" if last == STEPS else "pruned", last, values,
                                       seed_interval(values), VAL_SE, {}))
    return summaries, pruned, spent


def one_sweep(search: SearchConfig, means: list[float], world: World) -> Outcome:
    from orchestrator.sweep import ranked, verdict_against_baseline

    summaries, pruned, spent = select(search, means, world)
    finished = ranked([s for s in summaries if s.state == "finished"] or summaries, search)
    _, _, tags = verdict_against_baseline(summaries, finished, search)
    challenger = int(tags["verdict_config"]) if tags else None
    if search.confirm is None or challenger is None:
        return Outcome(tags.get("verdict", "inconclusive"), challenger, pruned, spent)
    cfg = search.confirm

    def train(seeds: list[int]) -> tuple[list[float], list[float]]:
        return world.finals(means[challenger], seeds), world.finals(means[0], seeds)

    result = decisions.confirm(train, search.seeds, decisions.looks(cfg.seeds, cfg.add, cfg.max_seeds), cfg.alpha,
                               cfg.margin, search.mode, cfg.spending)
    return Outcome(result.look.verdict, challenger, pruned, spent + 2 * len(result.seeds) * STEPS)


def rates(search: SearchConfig, means: list[float], sweeps: int, sd: float, seed: int) -> dict[str, float]:
    """Over `sweeps` simulated sweeps: P(false better/worse), P(the truly best confirmed better),
    P(the truly best pruned), mean trial-steps."""
    world = World(np.random.default_rng(seed), sd)
    best = int(np.argmax(means)) if max(means) > means[0] else None
    false = confirmed = pruned = steps = 0
    for _ in range(sweeps):
        out = one_sweep(search, means, world)
        if out.verdict in ("better", "worse") and out.challenger is not None:
            truth = means[out.challenger] - means[0]
            false += (out.verdict == "better" and truth <= 0) or (out.verdict == "worse" and truth >= 0)
        confirmed += best is not None and out.verdict == "better" and out.challenger == best
        pruned += best is not None and best in out.pruned
        steps += out.trial_steps
    return {"false_verdict": false / sweeps, "best_confirmed": confirmed / sweeps if best is not None else math.nan,
            "best_pruned": pruned / sweeps if best is not None else math.nan, "trial_steps": steps / sweeps}


def search_config(procedure: dict) -> SearchConfig:
    return SearchConfig.model_validate({"space": SPACE, "metric": METRIC, "mode": "max", "num_samples": 4,
                                        "baseline": {"x": 0}, **procedure})


def decision_figures(quick: bool, sd: float = 0.04, seed: int = 0) -> dict:
    """Every scenario x procedure; the same simulated seeds' stream for both procedures."""
    sweeps = 200 if quick else 2000
    from orchestrator.console import console

    out = {"sweeps": sweeps, "seed_sd": sd, "scenarios": {}}
    for name, means in scenarios(sd).items():
        out["scenarios"][name] = {}
        for proc, spec in PROCEDURES.items():
            out["scenarios"][name][proc] = rates(search_config(spec), means, sweeps, sd, seed)
            console.print(f"  {name}, {proc}: {sweeps} sweeps", highlight=False)
    return out


def tune_figures(sweeps: int, sd: float = 0.04, seed: int = 0) -> dict:
    """The new procedure end to end through Ray Tune and Optuna (the sweep's searcher and scheduler,
    its summaries from Tune's ResultGrid) with a cheap simulated trainable: a configuration with x > 0.5
    is better by 2 seed SDs. Its rates, next to the fast path's on the same scenario."""
    import tempfile
    from pathlib import Path

    import ray
    from ray import tune

    from orchestrator.summary import summarize
    from orchestrator.sweep import make_scheduler, make_searcher, ranked, verdict_against_baseline

    search = search_config({**PROCEDURES[NEW],
                            "points_to_evaluate": [{"x": 0.0}]})

    def mean(x: float) -> float:
        return FINAL + 2 * sd if x > 0.5 else FINAL

    def trainable_for(rep: int):
        def trainable(config: dict) -> None:
            trial = zlib.crc32(tune.get_context().get_trial_id().encode())
            world = World(np.random.default_rng([seed, rep, trial]), sd)
            for step, values in world.run(mean(config["x"]), search.seeds).items():
                tune.report(report(values, step))

        return trainable

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    confirmed = false = steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(sweeps):
            records = f"{tmp}/s{rep}"  # the scheduler's stops, as a sweep records them in its folder
            config = tune.TuneConfig(search_alg=make_searcher(search, Path(tmp) / f"o{rep}.db", f"s{rep}",
                                                              {"storage": records}),
                                     scheduler=make_scheduler(search, STEPS, record_to=records), metric=METRIC,
                                     mode="max", num_samples=search.num_samples, max_concurrent_trials=1)
            grid = tune.Tuner(trainable_for(rep), tune_config=config,
                              run_config=tune.RunConfig(name=f"s{rep}", storage_path=tmp, verbose=0)).fit()
            summaries = summarize(grid, METRIC, ["x"], uri=records)
            steps += sum(s.steps * search.seeds for s in summaries)
            finished = ranked([s for s in summaries if s.state == "finished"] or summaries, search)
            _, _, tags = verdict_against_baseline(summaries, finished, search)
            if not tags:
                continue
            challenger = next(s for s in summaries if s.config_id == tags["verdict_config"])
            world = World(np.random.default_rng([seed, rep, 10_000]), sd)
            cfg = search.confirm
            result = decisions.confirm(
                lambda seeds: (world.finals(mean(challenger.params["x"]), seeds), world.finals(FINAL, seeds)),
                search.seeds, decisions.looks(cfg.seeds, cfg.add, cfg.max_seeds), cfg.alpha, cfg.margin)
            steps += 2 * len(result.seeds) * STEPS
            better = mean(challenger.params["x"]) > FINAL
            confirmed += result.look.verdict == "better" and better
            false += (result.look.verdict == "better" and not better) or result.look.verdict == "worse"
    ray.shutdown()
    return {"sweeps": sweeps, "better_confirmed": confirmed / sweeps, "false_verdict": false / sweeps,
            "trial_steps": steps / sweeps}
