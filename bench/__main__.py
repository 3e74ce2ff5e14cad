"""python -m bench [SPEC] [--steps N]: where one trial's time goes, as shares measured in one run.

Runs one trial of the spec (default: search_spaces/ead.yaml) and reads its per-step timings back
from MLflow: the share of step time of each phase (generate, score, old-logprob, update, weight
sync), and the share of wall time spent in `ray.train.report` (a barrier on every rank).
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

PHASES = ("generate", "score", "old_logprob", "update", "sync")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.strip())
    parser.add_argument("spec", nargs="?", default="search_spaces/ead.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default="runs/bench/trial_phases.json")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, as in orchestrator.train")
    args = parser.parse_args()
    name = f"bench-{int(time.time())}"
    cfg = load_trial_spec(args.spec, [f"learner.steps={args.steps}", f"name={name}", "validation.every=0",
                                      "storage=runs/bench", *args.overrides])
    wall_start = time.perf_counter()
    train.run(cfg)
    wall = time.perf_counter() - wall_start
    tracker = Tracker(train.default_tracking_uri(cfg.storage), cfg.logging.experiment)
    run = tracker.client.search_runs([tracker.experiment_id], f"attributes.run_name = '{name}'")[0]
    history = {k: dict(tracker.metric_history(run.info.run_id, f"timing/{k}")) for k in (*PHASES, "step", "report")}
    # Steady state: skip the first two steps (first Ray task, warm caches) and the last (it also
    # writes the final checkpoint inside its report).
    steady = range(3, args.steps)
    step_total = sum(history["step"][s] for s in steady)
    rows = {f"{p} / step": sum(history[p][s] for s in steady) / step_total for p in PHASES}
    rows["other / step"] = 1.0 - sum(rows.values())
    reports = [history["report"][s] for s in steady if s in history["report"]]
    loop_wall = step_total + sum(reports)
    rows["ray.train.report / loop wall"] = sum(reports) / loop_wall
    rows["weight sync / loop wall"] = sum(history["sync"][s] for s in steady) / loop_wall
    figures = {"shares": rows, "mean_step_s": step_total / len(steady),
               "mean_report_call_s": sum(reports) / max(len(reports), 1), "reports": len(reports),
               "trial_wall_s": wall, "steps": args.steps}
    table = Table(title=f"one trial of {args.spec}, {args.steps} steps, steady state: steps 3-{args.steps - 1}")
    table.add_column("share")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        table.add_row(key, f"{value:.1%}")
    table.add_row("mean step (s)", f"{figures['mean_step_s']:.2f}")
    table.add_row(f"one ray.train.report call (s), {len(reports)} calls", f"{figures['mean_report_call_s']:.3f}")
    table.add_row("trial wall incl. start-up (s)", f"{wall:.1f}")
    Console().print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
