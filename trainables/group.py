"""Several seeds of a configuration in one Ray Train run (a sweep splits a configuration's seeds over
`search.seed_runs` runs: orchestrator/seeds.py, `runs_of`): on each learner rank, every seed is a `Trial`
of its own (its DeepSpeed engine, RNG streams, MLflow run, checkpoint folder), stepped together.

    RL step s:  seed 0's step: its rollouts; seed 1's generation starts on the engines (seed 1's weights
                pushed first); seed 0's update and validation on the rank meanwhile
                seed 1's step: its rollouts; seed 2's (or seed 0's next) generation starts; its update ...
                -> one report to Ray Train: each seed's report, and their mean (checkpoints kept by it);
                   a checkpoint holding every seed (seed_<r>/...) when one is due

Each seed's generation uses its own latest weights, as alone: the engines and the rank work at once
without any seed training behind its policy.

The processes, imports, engines, verifier and Ray Train's own actors are paid once per run, not once
per seed; a seed's numbers are those it reaches alone (tests/test_group.py). A run of one seed
is the plain trial: its report and its checkpoint's layout are the seed's own.
"""

from __future__ import annotations

import time

import pyarrow.fs
import ray

from trainables.runtime import resume
from trainables.runtime.notices import TRAINING, Notices, WorkerTerminating, arm_sigterm_notice, stop_asked
from trainables.runtime.seed_reports import group_report
from trainables.trial import Trial, TrialInputs


class TrialGroup:
    """The seeds of one Ray Train run on this rank; `run()` steps them together."""

    def __init__(self, inputs: list[TrialInputs]):
        self.trials: list[Trial] = []
        for slot, one in enumerate(inputs):  # each seed built with its own RNG streams (Trial seeds them)
            shared = self.trials[0].client.shared if self.trials else None
            self.trials.append(Trial(one, slot, shared, grouped=len(inputs) > 1))
        first = self.trials[0]
        self.cfg, self.rank, self.world = first.cfg, first.rank, first.world
        self.name = inputs[0].run_name or first.cfg.name
        self.trust_unsealed = inputs[0].trust_unsealed
        # The stop file is resolved once.
        self.stop_file = pyarrow.fs.FileSystem.from_uri(inputs[0].stop_file) if inputs[0].stop_file else None
        self.notices = Notices(self.rank, inputs[0].engines)  # drains and SIGTERM: checkpoint before the resources go
        self.start_step = 0
        self.save_seconds: float | None = None  # the latest checkpoint's cost, for the deadline
        self.last_step_seconds: float | None = None

    def restore(self) -> None:
        """Continue every seed from the latest intact checkpoint; a corrupt latest one falls back to an older one."""
        states = resume.restore(
            [(t.part, t.learner) for t in self.trials], self.rank, self.world, self.name, trust=self.trust_unsealed
        )
        for trial, state in zip(self.trials, states or [], strict=False):
            trial.load_state(state)
        self.start_step = self.trials[0].start_step

    def run(self) -> None:
        self.restore()
        for trial in self.trials:
            with trial.own_rng():
                trial.begin()
        for step in range(self.start_step, self.cfg.learner.steps):
            done = []
            for slot, trial in enumerate(self.trials):
                trial.then = self.next_generation(step, slot)
                with trial.own_rng():
                    done.append(trial.advance(step))
            self.last_step_seconds = sum(metrics["timing/step"] for metrics, _ in done)
            validated = any(v for _, v in done)
            if self.end_step(step, [metrics for metrics, _ in done], validated, step == self.cfg.learner.steps - 1):
                for trial in self.trials:
                    trial.record.say(f"stopped after step {step + 1} with a checkpoint; --resume continues it")
                return

    def next_generation(self, step: int, slot: int):
        """What starts once seed `slot` has its step-`step` rollouts: the next seed's generation (the first
        seed's next step after the last seed), so the engines generate while this rank updates. None
        without a next one, with rollout.overlap (each seed already generates its next batch ahead), and
        with engines colocated on the learner's GPUs (they sleep while it updates)."""
        step, slot = (step, slot + 1) if slot + 1 < len(self.trials) else (step + 1, 0)
        ro = self.cfg.rollout
        if len(self.trials) == 1 or ro.overlap or ro.colocate or step >= self.cfg.learner.steps:
            return None
        return lambda: self.trials[slot].feed.submit(step)

    def end_step(self, step: int, metrics: list[dict[str, float]], validated: bool, last: bool) -> bool:
        """Report the step to Ray Train, with a checkpoint when it is due, asked for (a stop: True) or
        a notice came; a SIGTERM'd process then leaves (Ray Train restarts the ranks from it), a drain
        lets training go on until Ray Train moves the ranks at its deadline."""
        cfg = self.cfg
        stop = not last and stop_asked(
            self.rank, self.stop_file, cfg.checkpoint.save_by, self.last_step_seconds, self.save_seconds
        )
        notice = None if last or stop else self.notices.new()
        reported = [trial.reported(m, stop) for trial, m in zip(self.trials, metrics, strict=True)]
        start, saved = time.perf_counter(), {}
        if last or stop or notice or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
            parts = [trial.checkpoint_part(r) for trial, r in zip(self.trials, reported, strict=True)]
            # Every step up to this checkpoint is in MLflow before it is committed: a resume skips them.
            self.save_seconds = resume.save(parts, step, self.rank, self.world, group_report(reported), self.drain)
            saved = {"timing/checkpoint": self.save_seconds}
            if notice:
                self.say(f"{notice}: checkpointed after step {step + 1}")
                if self.notices.terminating:
                    raise WorkerTerminating(
                        f"trial {self.name}: {notice}; restarting from the checkpoint after step {step + 1}"
                    )
        elif (step + 1) % cfg.logging.report_every == 0 or validated:
            ray.train.report(group_report(reported))
        else:
            return False
        for trial in self.trials:  # a barrier of all ranks
            trial.record.log(step, {**saved, "timing/report": time.perf_counter() - start})
        return stop

    def say(self, text: str) -> None:
        for trial in self.trials:
            trial.record.say(text)

    def drain(self) -> None:
        for trial in self.trials:
            trial.record.drain()

    def close(self) -> None:
        for trial in self.trials:
            trial.record.close()


def quiet_report_log() -> None:
    """Ray Train 2.60 logs every report's full metrics at INFO from a logger named by its file path,
    out of reach of `LoggingConfig`; the trial prints its own one-line progress instead."""
    import logging

    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point; `config["inputs"]`: the `TrialInputs` of each of the run's seeds."""
    quiet_report_log()
    arm_sigterm_notice()
    group = TrialGroup(config["inputs"])
    TRAINING.set()
    try:
        group.run()
    finally:
        TRAINING.clear()
        group.close()
