"""Early stopping that knows the noise: Tune's scheduler for `scheduler.name: intervals`.

At each rung (grace_period x reduction_factor^k RL steps, as ASHA's) a configuration's per-seed values
of the objective (`seeds/<r>/<metric>`, from the validation at or after the rung) are set against
those of every configuration that reached the rung before it; `decisions.prune` stops it only when its
upper bound lies below the best lower bound there. Rung records are plain data: Tune saves the
scheduler with the experiment, and a resumed sweep goes on with them.
"""

from __future__ import annotations

import re

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator.decisions import prune
from trainables.config import VAL_STEP


def rungs(grace_period: int, reduction_factor: float, max_t: int) -> list[int]:
    """Rung steps below the horizon: grace_period, grace_period x rf, ... (ASHA's milestones)."""
    out, step = [], float(grace_period)
    while step < max_t:
        if not out or int(step) > out[-1]:
            out.append(int(step))
        step *= reduction_factor
    return out


def seed_values(result: dict, metric: str) -> list[float]:
    """The objective, seed by seed, from a configuration's report (`seeds/<r>/<metric>`)."""
    pattern = re.compile(rf"seeds/(\d+)/{re.escape(metric)}")
    found = sorted((int(m.group(1)), float(v)) for k, v in result.items() if (m := pattern.fullmatch(k)))
    return [v for _, v in found]


class IntervalRungs(FIFOScheduler):
    """Stops a configuration at a rung only when its interval lies wholly below the rung's best."""

    def __init__(self, milestones: list[int], level: float = 0.95, time_attr: str = "progress/step"):
        super().__init__()
        self.milestones, self.level, self.time_attr = list(milestones), level, time_attr
        self.rungs: dict[int, dict[str, list[float]]] = {m: {} for m in self.milestones}
        self.stopped: dict[str, int] = {}  # trial id -> the rung that stopped it

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self.decide(trial.trial_id, result)

    def decide(self, trial_id: str, result: dict) -> str:
        """CONTINUE or STOP for one report (the Tune-free core, which the decisions bench drives)."""
        step, validated = result.get(self.time_attr, 0), result.get(VAL_STEP, result.get(self.time_attr, 0))
        values = seed_values(result, self._metric)
        for milestone in self.milestones:
            rung = self.rungs[milestone]
            if trial_id in rung or step < milestone or validated < milestone or not values:
                continue
            others = dict(rung)
            rung[trial_id] = values
            if prune(values, others, self.level, self._mode or "max"):
                self.stopped[trial_id] = milestone
                return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        return f"IntervalRungs: rungs {self.milestones}, {len(self.stopped)} stopped"
