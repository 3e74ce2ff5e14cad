"""What a trial's rank 0 records and says: its metrics in MLflow (`StepLogger`), the progress line, the
rollout samples and the validation curve, and where a resumed run picks up. Other ranks record nothing."""

from __future__ import annotations

from trainables.runtime.artifacts import rollout_samples_jsonl, validation_curve
from trainables.runtime.step_log import StepLogger

LOGGED_KEYS = ("progress/step", "timing/validate")  # per-step metrics; and step 0's base validation


def startup_breakdown(started_at: float | None, marks: dict[str, float]) -> dict[str, float]:
    """timing/startup (the driver's start, `started_at`, to the first step) and its stages, from the
    time.time() each one ended (`marks`, in order): ray (Ray's start, the actors asked for, the engines'
    placement), worker_imports (Ray Train's controller and worker processes, up to the end of their
    import of the trial's code), train_setup (to the train function: the process group), data, learner
    (model and DeepSpeed), restore_and_sync (checkpoint, first weight push). The engines load meanwhile
    (their health's load_seconds)."""
    if not started_at or None in marks.values():
        return {}
    times = [started_at, *marks.values()]
    stages = {f"timing/startup_{name}": end - begin for name, begin, end in zip(marks, times, times[1:])}
    return {"timing/startup": times[-1] - times[0], **stages}


class TrialLog:
    """tracking_uri, run_id: the trial's MLflow run (None: untracked); rollout_samples: rows of each
    validated step's rollouts kept as an artifact (`logging.rollout_samples`)."""

    def __init__(
        self, name: str, steps: int, tracking_uri: str | None, run_id: str | None, rank: int, rollout_samples: int
    ):
        self.name, self.steps, self.rank, self.rollout_samples = name, steps, rank, rollout_samples
        self.logger = StepLogger(tracking_uri, run_id) if rank == 0 else None

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(f"[trial {self.name}] {text}", flush=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger is not None:
            self.logger.log(step + 1, metrics)  # MLflow step 0 is the base policy

    @property
    def seconds(self) -> dict[str, float]:
        """timing/logging: rank 0's cumulative time spent logging ({} elsewhere)."""
        return {"timing/logging": self.logger.seconds} if self.logger is not None else {}

    def drain(self) -> None:
        """Every step logged so far is in MLflow (before a checkpoint: a resume skips them)."""
        if self.logger is not None:
            self.logger.drain()

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()  # what is queued reaches MLflow before the driver closes the run

    def resume(self, start_step: int) -> None:
        """Leave the steps already in the MLflow run alone, and record where the run resumed."""
        if self.logger is None:
            return
        logged = self.logger.logged_through(LOGGED_KEYS)
        self.logger.skip_through = logged
        if logged < 0:
            return
        redone = max(logged - start_step, 0)  # MLflow step s = RL steps done
        self.logger.log(start_step, {"faults/resumed_from_step": start_step, "faults/redone_steps": redone}, force=True)
        self.say(f"MLflow run has steps up to {logged}: {redone} recomputed steps will not be logged again")

    def progress(self, step: int, m: dict[str, float]) -> None:
        val = f" val/accuracy {m['val/accuracy']:.3f}" if "val/accuracy" in m else ""
        self.say(
            f"step {step + 1}/{self.steps} reward {m['rollout/reward_mean']:.3f} "
            f"accuracy {m['rollout/accuracy']:.3f} entropy {m['policy/entropy']:.3f} "
            f"length {m['rollout/response_length']:.1f}{val} ({m['timing/step']:.1f} s)"
        )

    def artifacts(self, step: int, val_history: list, rows) -> None:
        """A sample of the step's rollouts (rows: problems, rollouts, rewards, offpolicy) with their
        rewards, and the validation curve so far."""
        if self.logger is None:
            return
        if self.rollout_samples and rows is not None:
            problems, rollouts, rewards, offpolicy = rows
            self.logger.log_file(
                f"rollouts/step_{step + 1:06d}.jsonl",
                rollout_samples_jsonl(
                    step + 1,
                    [p.question for p in problems],
                    [p.answer for p in problems],
                    rollouts.texts,
                    rewards.tolist(),
                    rollouts.finish_reasons,
                    offpolicy.tolist(),
                    rollouts.n,
                    self.rollout_samples,
                ),
            )
        csv, png = validation_curve(val_history, f"{self.name}: validation")
        self.logger.log_file("validation_curve.csv", csv)
        self.logger.log_file("validation_curve.png", png)
