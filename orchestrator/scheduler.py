"""Early stopping that knows the noise: Tune's scheduler for `scheduler.name: intervals`.

At each rung (grace_period x reduction_factor^k RL steps, as ASHA's) a configuration's per-seed values
of the objective (`seeds/<r>/<metric>`, from the validation at or after the rung) are set against
those of every configuration that reached the rung before it; `decisions.prune` stops it only when its
upper bound lies below the best lower bound there. Rung records are plain data: Tune saves the
scheduler with the experiment, and a resumed sweep goes on with them.

Every stop either scheduler decides is written first to `<experiment>/pruned/<trial id>.json`
(`record_pruned`): a configuration is `pruned` in MLflow, Optuna and the report only where that
durable record says so, never because its last result is missing (a driver killed in between).
"""

from __future__ import annotations

import json
import re

import pyarrow.fs
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from orchestrator.decisions import prune_bounds
from trainables.config import VAL_STEP

PRUNED_FOLDER = "pruned"


def record_pruned(uri: str, trial_id: str, step: int, why: str = "") -> None:
    """The scheduler stopped `trial_id` at RL step `step` (`why`: the rung's rule in numbers): said
    durably, before Tune acts on it."""
    fs, path = pyarrow.fs.FileSystem.from_uri(f"{uri.rstrip('/')}/{PRUNED_FOLDER}/{trial_id}.json")
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps({"step": int(step), "why": why}).encode())


def pruned_record(uri: str | None, trial_id: str) -> tuple[int, str] | None:
    """(the RL step the scheduler stopped `trial_id` at, why) from its durable record; None if it never did."""
    if not uri:
        return None
    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(f"{uri.rstrip('/')}/{PRUNED_FOLDER}/{trial_id}.json")
        with fs.open_input_stream(path) as f:
            record = json.loads(f.read())
        why = record.get("why", "")
        return int(record["step"]), why if isinstance(why, str) else ""
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # FileNotFoundError is an OSError
        return None


def pruned_at(uri: str | None, trial_id: str) -> int | None:
    """The RL step the scheduler stopped `trial_id` at, from its durable record; None if it never did."""
    record = pruned_record(uri, trial_id)
    return None if record is None else record[0]


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

    def __init__(
        self, milestones: list[int], level: float = 0.95, time_attr: str = "progress/step", record_to: str | None = None
    ):
        super().__init__()
        self.milestones, self.level, self.time_attr = list(milestones), level, time_attr
        self.record_to = record_to  # the experiment's folder or URI: where each stop is recorded
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
            bounds = prune_bounds(values, others, self.level, self._mode or "max")
            if bounds is not None and bounds[0] < bounds[1]:
                self.stopped[trial_id] = milestone
                if self.record_to:
                    record_pruned(self.record_to, trial_id, step, self.why(bounds, milestone, len(others)))
                return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def why(self, bounds: tuple[float, float], milestone: int, others: int) -> str:
        near, far = ("upper", "lower") if (self._mode or "max") == "max" else ("lower", "upper")
        sign = 1 if near == "upper" else -1
        return (
            f"its {self.level:.0%} {near} bound of {self._metric} ({sign * bounds[0]:.3f}) lay beyond the best "
            f"{far} bound ({sign * bounds[1]:.3f}) of the {others} configuration(s) at the rung of step {milestone}"
        )

    def debug_string(self) -> str:
        return f"IntervalRungs: rungs {self.milestones}, {len(self.stopped)} stopped"


class RecordedASHA(ASHAScheduler):
    """Ray's ASHA, each stop recorded durably (`record_pruned`) before Tune acts on it."""

    def __init__(self, *args, record_to: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.record_to = record_to

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        step = result.get(self._time_attr, 0)  # at max_t ASHA also says STOP: the trial ended, it was not pruned
        if decision == TrialScheduler.STOP and self.record_to and step < self._max_t:
            record_pruned(self.record_to, trial.trial_id, step, self.why(trial.trial_id, step))
        return decision

    def why(self, trial_id: str, step: int) -> str:
        """The rung's cut-off, recomputed as Ray's `_Bracket.on_result` took it: the (1 - 1/rf) quantile of
        the values recorded at the rung before this one's (Ray pinned: `_trial_info`, `_rungs`, `cutoff`)."""
        bracket = self._trial_info.get(trial_id)
        for milestone, recorded in getattr(bracket, "_rungs", []):
            if milestone <= step and trial_id in recorded:
                others = {k: v for k, v in recorded.items() if k != trial_id}
                cutoff, value = bracket.cutoff(others), recorded[trial_id]
                if cutoff is None:
                    break
                side = "below" if self._metric_op > 0 else "above"
                return (
                    f"its {self._metric} ({self._metric_op * value:.3f}) was {side} the cut-off "
                    f"({self._metric_op * cutoff:.3f}) of the rung of step {milestone:g}: ASHA lets the best "
                    f"1/{bracket.rf:g} of the {len(others) + 1} configuration(s) there go on"
                )
        return ""
