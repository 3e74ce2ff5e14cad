"""python -m bench [SPEC] [--steps N] [--algorithms grpo,luffy,oger]: where a trial's time goes.

Default: one trial of the spec (search_spaces/ead.yaml); its per-step timings are read back from
MLflow and printed as shares of the step (generate, score, old-logprob, offline mixing, update,
weight sync) and of the loop's wall time (`ray.train.report`, a barrier on every rank).

--algorithms: one trial per algorithm preset, same spec, seed and steps, run one after the other
in one process (one Ray cluster), and the ratios of their mean steady-state step times (the OGER
paper's Table 4 compares GPU-hours: OGER 168 : Luffy 120 : GRPO 75).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator import train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import Tracker

PHASES = ("generate", "score", "old_logprob", "offline", "update", "sync")
STORAGE = "runs/bench"


def run_trial(spec: str, steps: int, overrides: list[str]) -> tuple[dict[str, dict[int, float]], float]:
    """Run one trial; return its per-step timings {phase: {mlflow step: seconds}} and its wall time."""
    name = f"bench-{time.time_ns()}"
    cfg = load_trial_spec(spec, [f"learner.steps={steps}", f"name={name}", "validation.every=0",
                                 f"storage={STORAGE}", *overrides])
    start = time.perf_counter()
    train.run(cfg)
    wall = time.perf_counter() - start
    tracker = Tracker(train.default_tracking_uri(cfg.storage), cfg.logging.experiment)
    run = tracker.client.search_runs([tracker.experiment_id], f"attributes.run_name = '{name}'")[0]
    return {k: dict(tracker.metric_history(run.info.run_id, f"timing/{k}"))
            for k in (*PHASES, "step", "report")}, wall


def phase_figures(history: dict[str, dict[int, float]], steps: int) -> dict:
    """Shares of the steady state: steps 3..steps-1 (the first two warm caches, the last checkpoints)."""
    steady = range(3, steps)
    step_total = sum(history["step"][s] for s in steady)
    shares = {f"{p} / step": sum(history[p].get(s, 0.0) for s in steady) / step_total for p in PHASES}
    shares["other / step"] = 1.0 - sum(shares.values())
    reports = [history["report"][s] for s in steady if s in history["report"]]
    loop_wall = step_total + sum(reports)
    shares["ray.train.report / loop wall"] = sum(reports) / loop_wall
    shares["weight sync / loop wall"] = sum(history["sync"][s] for s in steady) / loop_wall
    return {"shares": shares, "mean_step_s": step_total / len(steady),
            "mean_report_call_s": sum(reports) / max(len(reports), 1), "reports": len(reports)}


def print_phases(figures: dict, title: str) -> None:
    table = Table(title=title)
    table.add_column("share")
    table.add_column("value", justify="right")
    for key, value in figures["shares"].items():
        table.add_row(key, f"{value:.1%}")
    table.add_row("mean step (s)", f"{figures['mean_step_s']:.2f}")
    table.add_row(f"one ray.train.report call (s), {figures['reports']} calls", f"{figures['mean_report_call_s']:.3f}")
    table.add_row("trial wall incl. start-up (s)", f"{figures['trial_wall_s']:.1f}")
    Console().print(table)


def compare_algorithms(spec: str, steps: int, overrides: list[str], algorithms: list[str]) -> dict:
    per_algo = {}
    for algo in algorithms:
        history, wall = run_trial(spec, steps, [*overrides, f"algorithm.name={algo}"])
        per_algo[algo] = {**phase_figures(history, steps), "trial_wall_s": wall}
    base = per_algo[algorithms[0]]["mean_step_s"]
    table = Table(title=f"{spec}, {steps} steps per algorithm, steady-state step time")
    for column in ("algorithm", "mean step (s)", f"/ {algorithms[0]}", "offline mixing / step"):
        table.add_column(column, justify="right")
    for algo, fig in per_algo.items():
        table.add_row(algo, f"{fig['mean_step_s']:.2f}", f"{fig['mean_step_s'] / base:.2f}",
                      f"{fig['shares']['offline / step']:.1%}")
    Console().print(table)
    ratios = {f"{a} / {b}": per_algo[a]["mean_step_s"] / per_algo[b]["mean_step_s"]
              for i, a in enumerate(algorithms) for b in algorithms[:i]}
    for key, value in ratios.items():
        print(f"step time {key}: {value:.2f}")
    return {"algorithms": per_algo, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", default="search_spaces/ead.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--algorithms", help="comma-separated presets to compare, e.g. grpo,luffy,oger")
    parser.add_argument("--out", default=f"{STORAGE}/bench.json")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, as in orchestrator.train")
    args = parser.parse_args()
    if args.steps < 5:
        parser.error("--steps must be >= 5: steps 3..N-1 are the steady state")
    if args.algorithms:
        figures = compare_algorithms(args.spec, args.steps, args.overrides, args.algorithms.split(","))
    else:
        history, wall = run_trial(args.spec, args.steps, args.overrides)
        figures = {**phase_figures(history, args.steps), "trial_wall_s": wall}
        print_phases(figures, f"one trial of {args.spec}, {args.steps} steps, steady state: steps 3-{args.steps - 1}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
