"""Where a trial's time goes, read back from its MLflow run: compute phases against the loop's wall
time at steady state, start-up, weight sync, checkpoints, reporting and logging; and the step time
of one algorithm preset against another on the same spec, seed and rollouts; and the first preset's
wall per step with generation overlapped with training (rollout.overlap 1) against without.

Steady state: after the first two steps (caches, allocator and compiled kernels warm up) and before
the last (the final checkpoint). MLflow step s is "s RL steps done"; `timing/loop_wall` and
`timing/logging` are cumulative, read when step s is logged, so the window (a, b] holds steps a+1..b
and the report, checkpoint and logging that follow steps a..b-1.
"""

from __future__ import annotations

import time

from orchestrator import train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker, default_tracking_uri
from trainables.metrics import PLACEHOLDERS

COMPUTE = ("generate", "score", "old_logprob", "offline", "update")  # the model's work
STARTUP = PLACEHOLDERS["stage"]  # timing/startup_<stage>, in order
KEYS = (
    *COMPUTE,
    "sync",
    "step",
    "report",
    "checkpoint",
    "startup",
    *(f"startup_{s}" for s in STARTUP),
    "loop_wall",
    "logging",
    "encoder",
)
WARMUP_STEPS = 2


def run_trial(spec: str, storage: str, steps: int, overrides: list[str]) -> dict[str, dict[int, float]]:
    """Run one trial; its timing history {key: {MLflow step: seconds}}."""
    name = f"bench-{time.time_ns()}"
    cfg = load_trial_spec(
        spec, [f"learner.steps={steps}", f"name={name}", "validation.every=0", f"storage={storage}", *overrides]
    )
    train.run(cfg)
    tracker = Tracker(default_tracking_uri(cfg.storage), cfg.logging.experiment)
    (run,) = tracker.client.search_runs([tracker.experiment_id], f"attributes.run_name = '{name}'")
    return {key: dict(tracker.metric_history(run.info.run_id, f"timing/{key}")) for key in KEYS}


def steady_figures(history: dict[str, dict[int, float]], steps: int, checkpoint_every: int) -> dict[str, float]:
    a, b = WARMUP_STEPS, steps - 1

    def total(key: str, first: int, last: int) -> float:
        return sum(history[key].get(s, 0.0) for s in range(first, last + 1))

    wall = history["loop_wall"][b] - history["loop_wall"][a]
    compute = sum(total(key, a + 1, b) for key in COMPUTE)
    checkpoints = total("checkpoint", a, b - 1)
    saved = [v for s, v in history["checkpoint"].items() if a <= s < b]
    mean_step_wall = (wall - checkpoints) / (b - a)
    step_total = total("step", a + 1, b)
    shares = {phase: total(phase, a + 1, b) / step_total for phase in (*COMPUTE, "sync")}
    return {
        "phase_share_of_step": {**shares, "other": 1 - sum(shares.values())},
        "steady_steps": b - a,
        "mean_step_s": step_total / (b - a),
        "mean_step_wall_s": mean_step_wall,  # the loop's wall per step: what overlapping phases shortens
        "encoder_s_per_step": total("encoder", a + 1, b) / (b - a),  # oger*: the encoder actor's busy time
        "compute_s": compute,
        "wall_s": wall,
        # checkpoints have their own row: the overhead is the rest of what is not the model's work
        "overhead": (wall - checkpoints) / compute,
        "startup_s": history["startup"][1],
        "startup_stages_s": {stage: history[f"startup_{stage}"][1] for stage in STARTUP},
        "sync_share_of_step": shares["sync"],
        "checkpoint_s": sum(saved) / max(len(saved), 1),
        "checkpoint_share_of_interval": (sum(saved) / max(len(saved), 1)) / (checkpoint_every * mean_step_wall),
        # timing/report of a checkpointing step includes the save: counted in the checkpoint row only
        "report_logging_share_of_wall": (
            total("report", a, b - 1) - checkpoints + history["logging"][b] - history["logging"][a]
        )
        / wall,
    }


def algorithm_ratios(
    spec: str, storage: str, steps: int, overrides: list[str], algorithms: tuple[str, ...]
) -> tuple[dict[str, dict], dict[str, float]]:
    """One trial per preset (the first is also the overhead trial); {preset: figures}, {"a / b": ratio}."""
    every = max(2, (steps - WARMUP_STEPS) // 2)
    first, overlapped = algorithms[0], f"{algorithms[0]}, overlap 1"
    trials = {algorithm: [f"algorithm.name={algorithm}"] for algorithm in algorithms}
    # rollout.overlap on the first preset: its phases run side by side, so its wall per step is compared
    trials[overlapped] = [f"algorithm.name={first}", "rollout.overlap=1"]
    figures = {}
    for name, extra in trials.items():
        history = run_trial(spec, storage, steps, [*overrides, *extra, f"checkpoint.every={every}"])
        figures[name] = {**steady_figures(history, steps, every), "checkpoint_every": every}
    ratios = {
        f"{x} / {y}": figures[x]["mean_step_s"] / figures[y]["mean_step_s"]
        for i, x in enumerate(algorithms)
        for y in algorithms[:i]
    }
    wall = {name: figures[name]["mean_step_wall_s"] for name in (first, overlapped)}
    ratios[f"wall overlap 1 / 0, {first}"] = wall[overlapped] / wall[first]
    if {"oger", "luffy"} <= figures.keys():  # what OGER adds besides its encoder's compute
        oger = figures["oger"]
        ratios["oger less its encoder's busy time / luffy"] = (
            oger["mean_step_s"] - oger["encoder_s_per_step"]
        ) / figures["luffy"]["mean_step_s"]
    return figures, ratios
