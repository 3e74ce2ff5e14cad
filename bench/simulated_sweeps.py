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
Scenarios: all equal; every other configuration worse by 1 seed SD; one configuration better by 1 and
by 2 seed SDs; a ladder (+0, +0.5, +1, +1.5 SDs). The baseline (the first configuration) is never the
better one, except where all are equal.

Worlds (`Knobs`, `WORLDS`): the calibrated one above, and worlds as harsh as real seeds: a seed's
effects shared across configurations (correlation rho: same data order, same validation problems),
Student-t seed effects, the best challenger noisier than the rest, the seed SD from 0.02 to 0.07, and
rung values that only partly predict final ones (a late effect that appears after the first rung). A
world draws a whole sweep's seeds at once (every configuration, the selection's seeds and the
confirmation's), so two procedures with the same seeds and confirmation see the same draws.
"""

from __future__ import annotations

import math
import types
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from orchestrator import decisions
from orchestrator.seeds import group_metrics
from orchestrator.spec import SearchConfig
from orchestrator.stats import seed_interval
from orchestrator.summary import ConfigSummary
from trainables.config import VAL_STEP

METRIC = "val/accuracy"
STEPS, EVERY, BASE, FINAL, VAL_SE, TAU = 30, 10, 0.21, 0.40, 0.019, 12.0
RUNG = 10  # the default's one interval rung (scheduler.grace_period; the next, 30, is the horizon)
VALIDATIONS = np.arange(EVERY, STEPS + 1, EVERY)  # [K] the validation steps
SPACE = {"x": {"uniform": [0.0, 1.0]}}
ALL_WORSE = "every other worse by 1 SD"
CALIBRATED = "calibrated (rho 0)"

# The procedure before the confirmation stage, the default (search_spaces/ead.yaml: tests/test_simulated_sweeps.py
# holds them equal) and two variants of it.
PROCEDURES = {
    "old: 3 seeds, ASHA, verdict on the selection seeds": {
        "seeds": 3,
        "scheduler": {"name": "asha", "grace_period": 10, "reduction_factor": 2},
    },
    "new: 2 seeds, interval rungs, confirmation on fresh seeds": {
        "seeds": 2,
        "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 6},
    },
    "new, Pocock-type spending": {
        "seeds": 2,
        "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 6, "spending": "pocock"},
    },
    "new, confirmation up to 12 pairs": {
        "seeds": 2,
        "scheduler": {"name": "intervals", "grace_period": 10, "reduction_factor": 3},
        "confirm": {"seeds": 3, "add": 3, "max_seeds": 12},
    },
}
NEW = "new: 2 seeds, interval rungs, confirmation on fresh seeds"


def scenarios(sd: float) -> dict[str, list[float]]:
    """True final means of the four configurations, the baseline first."""
    return {
        "all equal": [FINAL] * 4,
        ALL_WORSE: [FINAL, FINAL - sd, FINAL - sd, FINAL - sd],
        "one better by 1 SD": [FINAL, FINAL, FINAL + sd, FINAL],
        "one better by 2 SDs": [FINAL, FINAL, FINAL + 2 * sd, FINAL],
        "ladder (+0.5 SD each)": [FINAL + k * sd / 2 for k in range(4)],
    }


def shape(step):
    """How far along its curve a run is at `step` (a number or an array): 0 at the base policy, 1 at the
    last step."""
    return (1 - np.exp(-np.asarray(step) / TAU)) / (1 - math.exp(-STEPS / TAU))


def lateness(step):
    """How much of a late effect a run shows at `step`: none up to the first rung, all of it at the last step."""
    return np.clip((np.asarray(step) - RUNG) / (STEPS - RUNG), 0.0, 1.0)


@dataclass(frozen=True)
class Knobs:
    """A simulated world's seeds. The defaults are the calibrated world."""

    sd: float = 0.04  # a configuration's seed-to-seed SD of its final value (the rest's, where one is noisier)
    rho: float = 0.0  # correlation of one seed's effects across configurations (training and validation alike)
    df: float = math.inf  # degrees of freedom of the Student-t training effects; inf: normal
    noisy: float = 1.0  # the best challenger's seed SD over the rest's
    rung_r: float | None = None  # a seed's correlation between its value at the rung and its final value;
    # None: all of the training effect in place from the start (0.66 at sd 0.04, the validation noise apart)

    def __post_init__(self):
        if not self.sd >= VAL_SE:
            raise ValueError(f"sd {self.sd} is below the validation's own noise {VAL_SE}: give sd >= {VAL_SE}")
        if not 0 <= self.rho <= 1:
            raise ValueError(f"rho {self.rho} is not a correlation in [0, 1]: give one there")
        if not self.df > 2:
            raise ValueError(f"df {self.df}: a Student-t has a finite SD only above 2 degrees of freedom; give df > 2")
        if not self.noisy >= 1:
            raise ValueError(f"noisy {self.noisy}: the best challenger's SD over the rest's, at least 1")
        if self.rung_r is not None and not 0 < self.rung_r < 1:
            raise ValueError(f"rung_r {self.rung_r} is not a correlation in (0, 1): give one there, or None")


WORLDS: dict[str, Knobs] = {
    CALIBRATED: Knobs(),
    "seeds shared, rho 0.5": Knobs(rho=0.5),
    "seeds shared, rho 0.9": Knobs(rho=0.9),
    "Student-t seeds, 3 df": Knobs(df=3),
    "best challenger 2x as noisy": Knobs(noisy=2),
    "seed SD 0.02": Knobs(sd=0.02),
    "seed SD 0.07": Knobs(sd=0.07),
    "rung-final r 0.5": Knobs(rung_r=0.5),
    "t 3 df, best 2x as noisy, r 0.5": Knobs(df=3, noisy=2, rung_r=0.5),
}


def t_unit(t: np.ndarray, df: float) -> np.ndarray:
    """x = t · √((df - 2) / df): Student-t draws with df degrees of freedom scaled to SD 1. [...] -> [...]"""
    return t * math.sqrt((df - 2) / df)


def correlated(own: np.ndarray, common: np.ndarray, rho: float) -> np.ndarray:
    """x_{c,s} = √ρ · z_s + √(1 - ρ) · u_{c,s}: unit draws correlated ρ across configurations c.
    own u [C, S, ...], common z [S, ...] -> [C, S, ...]"""
    return math.sqrt(rho) * common[None] + math.sqrt(1 - rho) * own


def seed_sds(means: np.ndarray, sd: float, noisy: float) -> np.ndarray:
    """σ_c = sd · noisy for the best challenger c (the first on ties), sd for the others. means [C] -> [C]"""
    sds = np.full(len(means), float(sd))
    if len(means) > 1:
        sds[1 + int(np.argmax(means[1:]))] *= noisy
    return sds


def rung_final_r(early: np.ndarray, sd: np.ndarray, se: float, s: float) -> np.ndarray:
    """r = σ_e² s / (√(σ_e² s² + se²) · σ): a seed's rung-final correlation, early variance σ_e² shown at
    the fraction s of its curve at the rung, final SD σ. [C] -> [C]"""
    return early * s / (np.sqrt(early * s**2 + se**2) * sd)


def early_variance(r: float | None, sd: np.ndarray, se: float, s: float) -> np.ndarray:
    """σ_e² = (r²σ² + √(r⁴σ⁴ + 4 r²σ² se² / s²)) / 2, the root of `rung_final_r` = r; r None: all of the
    training variance, σ² - se². sd σ [C] -> [C]"""
    train = sd**2 - se**2
    if r is None:
        return train
    r2 = r**2 * sd**2
    early = (r2 + np.sqrt(r2**2 + 4 * r2 * se**2 / s**2)) / 2
    if np.any(early > train * (1 + 1e-9)):
        top = float(np.min(rung_final_r(train, sd, se, s)))
        raise ValueError(
            f"rung_r {r}: a seed SD of {float(np.min(sd)):.3f} reaches a rung-final correlation of at "
            f"most {top:.2f} (the validation's noise alone); give rung_r <= {top:.2f} or a larger sd"
        )
    return early


def curves(means: np.ndarray, early: np.ndarray, late: np.ndarray, noise: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """y_{c,s,k} = BASE + (μ_c - BASE + e_{c,s}) · shape(t_k) + l_{c,s} · lateness(t_k) + ε_{c,s,k}.
    means μ [C], early e [C, S], late l [C, S], noise ε [C, S, K], steps t [K] -> [C, S, K]"""
    rise = (means[:, None] - BASE + early)[..., None] * shape(steps)  # [C, S, K]
    return BASE + rise + late[..., None] * lateness(steps) + noise


class World:
    """Draws validation values in a world of `knobs` (a bare seed SD: the calibrated world at that SD): a
    persistent effect per (configuration, seed) growing with the curve, a late one appearing after the
    rung, and fresh measurement noise at every validation; seed s's draws correlated rho across
    configurations."""

    def __init__(self, rng: np.random.Generator, knobs: Knobs | float):
        self.rng, self.knobs = rng, knobs if isinstance(knobs, Knobs) else Knobs(sd=knobs)

    def unit(self, size) -> np.ndarray:
        """Unit-variance training-effect draws: normal, or Student-t with the world's df."""
        df = self.knobs.df
        return self.rng.standard_normal(size) if math.isinf(df) else t_unit(self.rng.standard_t(df, size), df)

    def draw(self, means: Sequence[float], seeds: int) -> np.ndarray:
        """[C, S, K]: each configuration's value at each validation, on seeds 0..seeds-1."""
        k, means = self.knobs, np.asarray(means, dtype=float)
        sds = seed_sds(means, k.sd, k.noisy)  # [C]
        early = early_variance(k.rung_r, sds, VAL_SE, float(shape(RUNG)))  # [C]
        late = np.sqrt(np.maximum(sds**2 - VAL_SE**2 - early, 0.0))  # [C]
        shape_cs = (len(means), seeds)
        e = correlated(self.unit(shape_cs), self.unit(seeds), k.rho) * np.sqrt(early)[:, None]  # [C, S]
        late_e = correlated(self.unit(shape_cs), self.unit(seeds), k.rho) * late[:, None]  # [C, S]
        noise = (
            correlated(
                self.rng.standard_normal((*shape_cs, len(VALIDATIONS))),
                self.rng.standard_normal((seeds, len(VALIDATIONS))),
                k.rho,
            )
            * VAL_SE
        )  # [C, S, K]
        return curves(means, e, late_e, noise, VALIDATIONS)

    def run(self, final: float, seeds: int) -> dict[int, list[float]]:
        """step -> per-seed values at each validation of `seeds` fresh seeds of one configuration."""
        values = self.draw([final], seeds)[0]  # [S, K]
        return {int(step): values[:, k].tolist() for k, step in enumerate(VALIDATIONS)}

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


def select(search: SearchConfig, values: np.ndarray) -> tuple[list[ConfigSummary], set[int], int]:
    """Run the configurations one at a time through the sweep's scheduler (none: each to the end): their
    summaries, the pruned ones, and the trial-steps spent. values [C, S, K]: each configuration's seeds
    at each validation."""
    from orchestrator.sweep import make_scheduler

    scheduler = make_scheduler(search, STEPS)
    if scheduler is not None:
        scheduler.set_search_properties(METRIC, search.mode)
    summaries, pruned, spent = [], set(), 0
    for i, history in enumerate(values):  # history [S, K]
        trial, last = types.SimpleNamespace(trial_id=str(i)), len(VALIDATIONS) - 1
        if scheduler is not None:
            scheduler.on_trial_add(None, trial)
            for k, step in enumerate(VALIDATIONS):  # the last report too, as a sweep's scheduler sees it
                stop = scheduler.on_trial_result(None, trial, report(history[:, k].tolist(), int(step))) == "STOP"
                if stop and step < STEPS:
                    pruned.add(i)
                    last = k
                    break
        steps, final = int(VALIDATIONS[last]), history[:, last].tolist()
        spent += steps * search.seeds
        summaries.append(
            ConfigSummary(
                str(i),
                {"x": i},
                "finished" if steps == STEPS else "pruned",
                steps,
                final,
                seed_interval(final),
                VAL_SE,
                {},
            )
        )
    return summaries, pruned, spent


def one_sweep(search: SearchConfig, means: list[float], world: World) -> Outcome:
    """One simulated sweep: the selection on seeds 0..seeds-1, the confirmation (if any) on the next ones."""
    from orchestrator.sweep import ranked, verdict_against_baseline

    cfg = search.confirm
    values = world.draw(means, search.seeds + (cfg.max_seeds if cfg else 0))  # [C, S, K]
    summaries, pruned, spent = select(search, values[:, : search.seeds])
    finished = ranked([s for s in summaries if s.state == "finished"] or summaries, search)
    _, _, tags = verdict_against_baseline(summaries, finished, search)
    challenger = int(tags["verdict_config"]) if tags else None
    if cfg is None or challenger is None:
        return Outcome(tags.get("verdict", "inconclusive"), challenger, pruned, spent)

    def train(seeds: list[int]) -> tuple[list[float], list[float]]:  # seeds numbered from search.seeds on
        return values[challenger, seeds, -1].tolist(), values[0, seeds, -1].tolist()

    result = decisions.confirm(
        train,
        search.seeds,
        decisions.looks(cfg.seeds, cfg.add, cfg.max_seeds),
        cfg.alpha,
        cfg.margin,
        search.mode,
        cfg.spending,
    )
    return Outcome(result.look.verdict, challenger, pruned, spent + 2 * len(result.seeds) * STEPS)


def outcomes(search: SearchConfig, means: list[float], sweeps: int, knobs: Knobs | float, seed: int) -> list[Outcome]:
    """`sweeps` simulated sweeps in one world, its draws seeded by `seed` (the same draws for every
    procedure whose seeds and confirmation agree)."""
    world = World(np.random.default_rng(seed), knobs)
    return [one_sweep(search, means, world) for _ in range(sweeps)]


def share(flags: Sequence[bool]) -> tuple[float, float]:
    """(p, its Monte Carlo standard error √(p (1 - p) / n))."""
    p = float(np.mean(flags))
    return p, math.sqrt(p * (1 - p) / len(flags))


def false_verdict(out: Outcome, means: list[float]) -> bool:
    """A "better" for a challenger not truly better than the baseline, or a "worse" for one not truly worse."""
    if out.verdict not in ("better", "worse") or out.challenger is None:
        return False
    truth = means[out.challenger] - means[0]
    return (out.verdict == "better" and truth <= 0) or (out.verdict == "worse" and truth >= 0)


def rates(search: SearchConfig, means: list[float], sweeps: int, knobs: Knobs | float, seed: int) -> dict[str, float]:
    """Over `sweeps` simulated sweeps: P(false better/worse), P("better"), P(the truly best chosen and
    confirmed better), P(the truly best pruned), mean trial-steps."""
    outs = outcomes(search, means, sweeps, knobs, seed)
    best = int(np.argmax(means)) if max(means) > means[0] else None
    found = {
        "false_verdict": share([false_verdict(o, means) for o in outs])[0],
        "better": share([o.verdict == "better" for o in outs])[0],
        "best_confirmed": share([o.verdict == "better" and o.challenger == best for o in outs])[0],
        "best_pruned": share([best in o.pruned for o in outs])[0],
        "trial_steps": float(np.mean([o.trial_steps for o in outs])),
    }
    if best is None:
        found["best_confirmed"] = found["best_pruned"] = math.nan
    return found


def saved(pruned: Sequence[float], unpruned: Sequence[float]) -> tuple[float, float]:
    """1 - R, R = Σ a / Σ b the compute with the rungs over without them on the same draws, and its
    standard error √(var(a - R b) / n) / mean(b) (the ratio estimator's)."""
    a, b = np.asarray(pruned, dtype=float), np.asarray(unpruned, dtype=float)
    ratio = a.sum() / b.sum()
    return float(1 - ratio), float(np.std(a - ratio * b, ddof=1) / math.sqrt(len(a)) / b.mean())


def world_rates(knobs: Knobs, sweeps: int, seed: int) -> dict[str, tuple[float, float]]:
    """The default procedure in one world, each figure with its Monte Carlo standard error: P(false
    verdict) all equal; P("better") every other worse; P(the truly best pruned) at 1 SD; P(the truly best
    chosen and confirmed better) at 2 SDs; the seed-runs a sweep spends there; and the share of them the
    rung rule saves against the same procedure unpruned, on the same draws."""
    default = search_config(PROCEDURES[NEW])
    unpruned = search_config({**PROCEDURES[NEW], "scheduler": {"name": "none"}})
    sc = scenarios(knobs.sd)
    null, worse, one, two, off = (
        outcomes(search, sc[name], sweeps, knobs, seed)
        for search, name in (
            (default, "all equal"),
            (default, ALL_WORSE),
            (default, "one better by 1 SD"),
            (default, "one better by 2 SDs"),
            (unpruned, "one better by 2 SDs"),
        )
    )
    best_one, best_two = (int(np.argmax(sc[name])) for name in ("one better by 1 SD", "one better by 2 SDs"))
    runs = np.array([o.trial_steps for o in two]) / STEPS
    return {
        "false_verdict": share([false_verdict(o, sc["all equal"]) for o in null]),
        "better_when_worse": share([o.verdict == "better" for o in worse]),
        "best_pruned": share([best_one in o.pruned for o in one]),
        "best_confirmed": share([o.verdict == "better" and o.challenger == best_two for o in two]),
        "seed_runs": (float(runs.mean()), float(runs.std(ddof=1) / math.sqrt(len(runs)))),
        "pruning_saves": saved([o.trial_steps for o in two], [o.trial_steps for o in off]),
    }


# How the default could spend its seeds (issue: power where the seeds decide): the selection's seeds, and the
# confirmation's looks (first pairs, pairs added a look, the most pairs). The first is the shipped default.
ALLOCATIONS = {
    "2 seeds; looks at 3, 6 pairs": {"seeds": 2, "confirm": {"seeds": 3, "add": 3, "max_seeds": 6}},
    "2 seeds; looks at 3, 6, 9, 12": {"seeds": 2, "confirm": {"seeds": 3, "add": 3, "max_seeds": 12}},
    "2 seeds; looks at 4, 8, 12, 16": {"seeds": 2, "confirm": {"seeds": 4, "add": 4, "max_seeds": 16}},
    "2 seeds; looks at 6, 12, 18, 24": {"seeds": 2, "confirm": {"seeds": 6, "add": 6, "max_seeds": 24}},
    "3 seeds; looks at 3, 6, 9, 12": {"seeds": 3, "confirm": {"seeds": 3, "add": 3, "max_seeds": 12}},
}


def allocation_rates(allocation: dict, knobs: Knobs, sweeps: int, seed: int) -> dict[str, tuple[float, float]]:
    """One allocation of seeds in one world, with Monte Carlo standard errors: P(false verdict) all equal,
    P(the truly best chosen and confirmed better) at 2 SDs, and the seed-runs a sweep spends there."""
    search = search_config({**PROCEDURES[NEW], **allocation})
    sc = scenarios(knobs.sd)
    null = outcomes(search, sc["all equal"], sweeps, knobs, seed)
    two = outcomes(search, sc["one better by 2 SDs"], sweeps, knobs, seed)
    best = int(np.argmax(sc["one better by 2 SDs"]))
    runs = np.array([o.trial_steps for o in two]) / STEPS
    return {
        "false_verdict": share([false_verdict(o, sc["all equal"]) for o in null]),
        "best_confirmed": share([o.verdict == "better" and o.challenger == best for o in two]),
        "seed_runs": (float(runs.mean()), float(runs.std(ddof=1) / math.sqrt(len(runs)))),
    }


def allocation_figures(quick: bool, seed: int = 0) -> dict:
    """Power against compute: every allocation of ALLOCATIONS in every world of WORLDS, and each allocation's
    worst world (lowest P(best confirmed)) and highest P(false verdict)."""
    from orchestrator.console import console

    sweeps = 200 if quick else 1000
    out: dict = {"sweeps": sweeps, "allocations": {}}
    for name, allocation in ALLOCATIONS.items():
        worlds = {world: allocation_rates(allocation, knobs, sweeps, seed) for world, knobs in WORLDS.items()}
        worst = min(worlds, key=lambda w: worlds[w]["best_confirmed"][0])
        out["allocations"][name] = {
            "worlds": worlds,
            "worst_world": worst,
            "worst_best_confirmed": worlds[worst]["best_confirmed"],
            "max_false_verdict": max(w["false_verdict"] for w in worlds.values()),
            "seed_runs": worlds[CALIBRATED]["seed_runs"],
        }
        console.print(f"  allocation {name}: {len(worlds)} worlds x {sweeps} sweeps", highlight=False)
    return out


def world_figures(quick: bool, seed: int = 0) -> dict:
    """`world_rates` in every world of WORLDS."""
    from orchestrator.console import console

    sweeps = 200 if quick else 2000
    out = {"sweeps": sweeps, "procedure": NEW, "worlds": {}}
    for name, knobs in WORLDS.items():
        out["worlds"][name] = {"knobs": asdict(knobs), **world_rates(knobs, sweeps, seed)}
        console.print(f"  world {name}: {sweeps} sweeps per scenario", highlight=False)
    return out


def search_config(procedure: dict) -> SearchConfig:
    return SearchConfig.model_validate(
        {"space": SPACE, "metric": METRIC, "mode": "max", "num_samples": 4, "baseline": {"x": 0}, **procedure}
    )


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


def confirmed_tune_sweep(summaries: list, search, world: World, mean) -> tuple[str, int]:
    """The confirmation after one simulated Tune sweep: ("better" when it confirms a truly better winner,
    "false" for a false verdict, "" otherwise; the confirmation's trial steps)."""
    from orchestrator.sweep import ranked, verdict_against_baseline

    finished = ranked([s for s in summaries if s.state == "finished"] or summaries, search)
    _, _, tags = verdict_against_baseline(summaries, finished, search)
    if not tags:
        return "", 0
    challenger = next(s for s in summaries if s.config_id == tags["verdict_config"])
    cfg = search.confirm
    result = decisions.confirm(
        lambda seeds: (world.finals(mean(challenger.params["x"]), seeds), world.finals(FINAL, seeds)),
        search.seeds,
        decisions.looks(cfg.seeds, cfg.add, cfg.max_seeds),
        cfg.alpha,
        cfg.margin,
    )
    better, verdict = mean(challenger.params["x"]) > FINAL, result.look.verdict
    said = "better" if verdict == "better" and better else "false" if verdict in ("better", "worse") else ""
    return said, 2 * len(result.seeds) * STEPS


def tune_figures(sweeps: int, sd: float = 0.04, seed: int = 0) -> dict:
    """The new procedure end to end through Ray Tune and Optuna (the sweep's searcher and scheduler,
    its summaries from Tune's ResultGrid) with a cheap simulated trainable: a configuration with x > 0.5
    is better by 2 seed SDs. Its rates, next to the fast path's on the same scenario."""
    import tempfile
    from pathlib import Path

    import ray
    from ray import tune

    from orchestrator.summary import summarize
    from orchestrator.sweep import make_scheduler, make_searcher

    search = search_config({**PROCEDURES[NEW], "points_to_evaluate": [{"x": 0.0}]})

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
            config = tune.TuneConfig(
                search_alg=make_searcher(search, Path(tmp) / f"o{rep}.db", f"s{rep}", {"storage": records}),
                scheduler=make_scheduler(search, STEPS, record_to=records),
                metric=METRIC,
                mode="max",
                num_samples=search.num_samples,
                max_concurrent_trials=1,
            )
            grid = tune.Tuner(
                trainable_for(rep),
                tune_config=config,
                run_config=tune.RunConfig(name=f"s{rep}", storage_path=tmp, verbose=0),
            ).fit()
            summaries = summarize(grid, METRIC, ["x"], uri=records)
            steps += sum(s.steps * search.seeds for s in summaries)
            world = World(np.random.default_rng([seed, rep, 10_000]), sd)
            said, more_steps = confirmed_tune_sweep(summaries, search, world, mean)
            steps += more_steps
            confirmed += said == "better"
            false += said == "false"
    ray.shutdown()
    return {
        "sweeps": sweeps,
        "better_confirmed": confirmed / sweeps,
        "false_verdict": false / sweeps,
        "trial_steps": steps / sweeps,
    }
