"""Optuna as Tune's searcher, keeping the study true to the RL run it stands for.

Ray's `OptunaSearch` keys intermediate values by Tune's report count and tells a trial that a
scheduler stopped `COMPLETE`, with its last (early) value as if final. Here intermediate values are
keyed by the RL step of the validation they come from (step 0: the base policy), a trial the scheduler
stopped (its durable record, `scheduler.record_pruned`) is `PRUNED`, a trial whose last report was lost
takes its value from its seeds' own MLflow records, and each Optuna trial carries the Tune trial id and
the MLflow runs
recording it, so the dashboard, the report and MLflow say the same thing about every trial. A
proposal lost with a killed driver (Tune never saved it) is `FAIL` on resume, never `RUNNING` forever,
and its configuration is proposed again (it never ran: a lost baseline must still be measured); a trial
told finished just before the driver was lost keeps that record when Tune ends it again.
"""

from __future__ import annotations

import warnings

from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

from orchestrator.seeds import ended, ran_to_end
from trainables.config import VAL_STEP


class StepOptunaSearch(OptunaSearch):
    """`OptunaSearch` with RL-step intermediate values, `PRUNED` for stopped trials, `FAIL` for errored
    ones, and user attributes `tune_trial_id` and `mlflow_run_ids` on every trial."""

    def __init__(self, *args, tracking: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracking = tracking or {}  # {"uri", "experiment", "sweep"}: where the trial's runs are
        self._reported: dict[str, set[int]] = {}

    def _setup_study(self, mode) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per study created or loaded
        super()._setup_study(mode)
        with warnings.catch_warnings():  # set_metric_names is marked experimental since Optuna 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._ot_study.set_metric_names(list(self.metric) if isinstance(self.metric, list) else [self.metric])

    def suggest(self, trial_id: str) -> dict | None:
        config = super().suggest(trial_id)
        if trial_id in self._ot_trials:  # from the proposal on: a proposal Tune never saw can be told apart
            self._ot_trials[trial_id].set_user_attr("tune_trial_id", trial_id)
        return config

    def restore(self, checkpoint_path: str) -> None:
        """The searcher as Tune last saved it. A trial the study holds `RUNNING` that the saved searcher
        does not know was proposed after that save and lost with the driver: it never ran, is `FAIL`, and
        its configuration is queued to be proposed again (after any point still waiting)."""
        import optuna

        super().restore(checkpoint_path)
        known = {trial.number for trial in self._ot_trials.values()}
        for lost in self._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if lost.number not in known:
                optuna.trial.Trial(self._ot_study, lost._trial_id).set_user_attr(
                    "lost", "proposed just before the driver was lost; Tune never started it"
                )
                self._ot_study.tell(lost.number, state=TrialState.FAIL)
                self._ot_study.enqueue_trial(lost.params, user_attrs={"proposed_again_for": lost.number})
        # A trial the study already holds finished was told before the driver was lost (after the saved
        # searcher): its record stands; Tune, resumed, ends it again, and nothing is told twice.
        finished = {t.number for t in self._ot_study.get_trials(deepcopy=False) if t.state.is_finished()}
        self._completed_trials.update(tid for tid, trial in self._ot_trials.items() if trial.number in finished)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self.metric, list) or trial_id in self._completed_trials or self.metric not in result:
            return
        reported = self._reported.setdefault(trial_id, set())
        values = {int(result.get(VAL_STEP, result.get("progress/step", 0))): result[self.metric]}
        if f"{self.metric}_base" in result:
            values[0] = result[f"{self.metric}_base"]
        for step, value in sorted(values.items()):
            if step not in reported:
                self._ot_trials[trial_id].report(value, step)
                reported.add(step)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials:
            return None  # told already: here, or before a lost driver (`restore`)
        if trial_id not in self._ot_trials:
            return super().on_trial_complete(trial_id, result, error)
        if result and not error:  # Tune hands the last result here, not to on_trial_result
            self.on_trial_result(trial_id, result)
        ot_trial = self._ot_trials[trial_id]
        ot_trial.set_user_attr("tune_trial_id", trial_id)
        if run_ids := self._run_ids(trial_id):
            ot_trial.set_user_attr("mlflow_run_ids", run_ids)
        if not error and ran_to_end(result or {}):
            return super().on_trial_complete(trial_id, result, error)
        state, value = "errored", None
        if not error:  # ended short: pruned only where the scheduler's record says so
            state, pruned, seeds = ended(
                result or {},
                self.tracking.get("storage"),
                trial_id,
                self._seeds if isinstance(self.metric, str) else None,
            )
            values = [v for _, _, v in seeds]
            if state == "finished" and values and None not in values:  # its last report was lost
                value = sum(values) / len(values)  # the seeds' own records stand for it
            elif state == "pruned":
                ot_trial.set_user_attr("pruned_at_step", pruned)
        if value is not None:
            return super().on_trial_complete(trial_id, {**(result or {}), self.metric: value})
        self._ot_study.tell(ot_trial, state=TrialState.PRUNED if state == "pruned" else TrialState.FAIL)
        self._completed_trials.add(trial_id)
        return None

    def _seeds(self, trial_id: str) -> list[tuple[int, int, float | None]]:
        """(RL steps logged, learner.steps, latest objective) of each of the configuration's seed runs."""
        if "uri" not in self.tracking:
            return []
        from orchestrator.tracking import Tracker

        tracker = Tracker(self.tracking["uri"], self.tracking["experiment"], retry_waits_s=(1,))
        return tracker.config_seeds(self.tracking["sweep"], trial_id, self.metric) or []

    def _run_ids(self, trial_id: str) -> list[str]:
        if "uri" not in self.tracking:
            return []
        from orchestrator.tracking import Tracker

        tracker = Tracker(self.tracking["uri"], self.tracking["experiment"], retry_waits_s=(1,))
        return tracker.config_run_ids(self.tracking["sweep"], trial_id) or []
