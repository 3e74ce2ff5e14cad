"""python -m bench [--quick] [--only SECTIONS] [--set KEY=VALUE ...]: the system's own costs, as ratios.

Every row is a ratio measured side by side in this run (absolute times on a shared machine are
noise), checked against its target, printed as one table and written as JSON:

  sweep    the default sweep, `python -m orchestrator.sweep SPEC`, run whole: its peak memory (PSS),
           its wall time, and the share of it its trials spent computing RL steps;
  seeds    what a seed costs: one configuration swept with 1 seed and with 3, every process's CPU seconds:
           the share of an average seed's cost beyond a marginal seed's (its own work), and a later
           seed's start;
  engines  EAD over fixed-temperature generation per backend (EAD's code path at tau = 1, so the
           same tokens are sampled; and the EAD recipe, whose hotter samples run longer), the
           rollout service actor over the same engine called in-process, the weight push by gloo
           broadcast over the push through Ray's object store;
  trials   one trial per algorithm preset (grpo, luffy, oger) on SPEC with the same seed: steady-state
           wall over compute, start-up, weight sync, checkpoint, report + logging, and step-time ratios
           (and grpo's wall per step with rollout.overlap 1 over 0);
           and how soon a command refuses a bad spec (a fresh process, median of three);
  learner  the learner's passes, chunked over the full-logits pass (bench/learner_costs.py): peak memory per
           response token over one fp32 logits row at V = 151,936, and update tokens/s;
  peers    TRL's GRPOTrainer against one trial of this project on the same work (bench/peers.py), ours
           synchronous and with rollout.overlap 1: s per RL step and start-up, ours over TRL's, and Ray
           Train's own start (an empty train function) over TRL's, one run per side a round, the order
           rotated each round;
  decisions the sweep's decision procedure on simulated configurations of known truth (bench/simulated_sweeps.py):
           error rates, the chance the truly best is pruned or confirmed, and the compute spent, old
           procedure beside new; then the default in worlds as harsh as real seeds (shared, heavy-tailed,
           unequal seed effects, late ones), each world's rates and the compute its rungs save;
           `python -m bench decisions` runs this section alone.

--quick (CI) runs the same code on fewer steps, repeats and trials: its figures are rougher. The
full run took about 7 minutes on 2 cores before the peers rows, which add about 3.5 (205 s measured alone).
docs/performance.md explains the cost model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from orchestrator.console import console, number_table
from orchestrator.tracking import tags_filter

SECTIONS = ("sweep", "seeds", "engines", "trials", "peers", "learner", "decisions")
ALGORITHMS = ("grpo", "luffy", "oger")
# row -> (direction, target); None: reported, no target
TARGETS: dict[str, tuple[str, float] | None] = {
    "orchestration overhead (steady wall / compute)": ("<=", 1.05),
    "trial start-up (s)": ("<=", 30.0),
    "bad input refused, from the command's start (s)": ("<=", 2.0),
    "step time oger / luffy": ("<=", 1.10),
    "step time luffy / grpo": None,
    "step time oger / grpo": None,
    "step time oger less its encoder's busy time / luffy": None,
    "step time wall overlap 1 / 0, grpo": ("<=", 0.75),
    "generation EAD / fixed, hf": ("<=", 1.03),
    "generation EAD recipe / T = 1, hf (longer samples)": None,
    "generation EAD / fixed, vllm": ("<=", 1.03),
    "generation EAD recipe / T = 1, vllm (longer samples)": None,
    "throughput service / direct, hf": (">=", 0.95),
    "weight push gloo / object store, hf": None,
    "weight sync / step": ("<=", 0.05),
    "checkpoint / its interval": ("<=", 0.05),
    "report + logging / wall": ("<=", 0.02),
    "peers: s per RL step, ours / TRL": ("<=", 0.85),
    "peers: s per RL step, ours with rollout.overlap 1 / TRL": None,
    "peers: start-up, ours / TRL": ("<=", 2.0),
    "peers: start-up, Ray Train's own (an empty train function) / TRL": None,
    "default sweep peak memory, PSS (GiB)": ("<=", 6.0),
    "default sweep trial compute / wall": None,
    "default sweep wall (min)": ("<=", 9.0),
    "seeds: per-seed overhead share, 3 seeds (1 - a marginal seed's core-s / an average seed's)": ("<=", 0.15),
    "seeds: core-s per seed, 3 seeds in one run / 1 seed alone": None,
    "seeds: a later seed's own start, its data and learner built (s)": ("<=", 2.0),
    "default sweep report / its wall": ("<=", 0.02),
    "learner memory per response token / fp32 logits row (V = 151,936)": ("<=", 0.25),
    "learner memory per response token / fp32 logits row, full-logits pass": None,
    "learner update tokens/s, chunked / full-logits pass": (">=", 0.95),
    "weight push peak extra memory / model size, ZeRO-3": ("<=", 0.1),
    "weight push peak extra memory / model size, whole-model copy first": None,
    "decisions: P(false better/worse), all equal, new": ("<=", 0.05),
    "decisions: P(false better/worse), all equal, old": None,
    "decisions: P(truly best pruned), 1 SD better, new": ("<=", 0.10),
    "decisions: P(truly best pruned), 1 SD better, old": None,
    "decisions: P(truly best confirmed better), 2 SDs, new up to 12 pairs": (">=", 0.8),
    "decisions: P(truly best confirmed better), 2 SDs, new (default, up to 6 pairs)": None,
    "decisions: P(truly best confirmed better), 2 SDs, old": None,
    "decisions: trial-steps new / old, 2 SDs": None,
    "decisions: P(false better/worse), all equal, new (default), worst world": ("<=", 0.05),
    "decisions: P(truly best chosen and confirmed better), 2 SDs, new (default), worst world": (">=", 0.8),
    "decisions: P(truly best pruned), 1 SD better, new (default), worst world": ("<=", 0.10),
    "decisions: compute saved by the interval rungs vs none, new (default), 2 SDs, calibrated world": None,
}


def cpu_model() -> str:
    """The CPU's model name and its widest vector instruction set: another CPU gives other floating
    point, and so other draws."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = next((isa for isa in ("avx512f", "avx2", "avx", "sse4_2") if isa in flags), platform.machine())
    return f"{name} ({isa.upper().replace('512F', '-512')})"


MC_SE: dict[str, float] = {}  # row -> the Monte Carlo standard error of a simulated rate


def verdict(row: str, value: float | str) -> str:
    """PASS or FAIL against the row's target; a simulated rate passes unless it misses by more than
    twice its Monte Carlo standard error (a rate whose truth sits at the target is a coin flip)."""
    target = TARGETS[row]
    if target is None or isinstance(value, str):
        return "-"
    direction, limit = target
    slack = 2 * MC_SE.get(row, 0.0)
    return "PASS" if (value - slack <= limit if direction == "<=" else value + slack >= limit) else "FAIL"


def sweep_rows(spec: str, storage: Path, quick: bool) -> tuple[dict, dict]:
    from bench.process_usage import peak_memory

    command = [
        sys.executable,
        "-m",
        "orchestrator.sweep",
        spec,
        "--storage",
        str(storage),
        "--name",
        f"sweep-{time.time_ns()}",
    ]
    if quick:
        command += ["--num-samples", "1", "--set", "learner.steps=3"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own cluster: all of it is measured
    console.print(f"[bold]sweep[/bold]: {' '.join(command[1:])}")
    figures = peak_memory(command, env=env)
    if figures["exit_code"]:
        raise SystemExit(f"bench: the sweep failed (exit {figures['exit_code']})")
    figures.update(sweep_compute(storage, command[command.index("--name") + 1], spec))
    return {
        "default sweep peak memory, PSS (GiB)": figures["peak_pss_gib"],
        "default sweep trial compute / wall": figures["compute_share"],
        "default sweep wall (min)": figures["wall_s"] / 60,
        "default sweep report / its wall": figures["report_share"],
    }, figures


def seed_rows(spec: str, storage: Path, quick: bool) -> tuple[dict, dict]:
    """What a seed costs: one configuration swept with 1 seed and with 3, every process's CPU seconds summed
    (bench/process_usage.py). The 2 more seeds' cost per seed is a seed's own work; what the average seed costs
    beyond it is the overhead a seed still pays (the run's processes, imports, engines, Ray Train)."""
    from bench.process_usage import peak_memory

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # their own clusters: all of them measured
    steps = ["--set", "learner.steps=5", "--set", "validation.every=5"] if quick else []
    figures = {}
    for seeds in (1, 3):
        name = f"seeds{seeds}-{time.time_ns()}"
        command = [
            sys.executable,
            "-m",
            "orchestrator.sweep",
            spec,
            "--storage",
            str(storage),
            "--name",
            name,
            "--num-samples",
            "1",
            "--set",
            f"search.seeds={seeds}",
            "--set",
            "search.seed_runs=1",  # the seeds in one run: what a marginal seed costs there
            *steps,
        ]
        console.print(f"[bold]seeds[/bold]: {' '.join(command[1:])}")
        run = peak_memory(command, interval_s=0.25, env=env)
        if run["exit_code"]:
            raise SystemExit(f"bench: the {seeds}-seed sweep failed (exit {run['exit_code']})")
        figures[seeds] = {**run, "later_start_s": later_seed_start(storage, name)}
    table = number_table("seeds: CPU seconds by process, one configuration's sweep", ["process", "1 seed", "3 seeds"])
    for kind in dict.fromkeys([*figures[3]["cpu_by_kind"], *figures[1]["cpu_by_kind"]]):
        table.add_row(
            kind,
            *(
                f"{figures[r]['cpu_by_kind'].get(kind, (0, 0.0))[1]:.1f} "
                f"({figures[r]['cpu_by_kind'].get(kind, (0, 0.0))[0]})"
                for r in (1, 3)
            ),
        )
    console.print(table)
    one, three = figures[1]["core_seconds"], figures[3]["core_seconds"]
    marginal, average = (three - one) / 2, three / 3
    figures.update(marginal_core_s=marginal, average_core_s=average)
    return {
        "seeds: per-seed overhead share, 3 seeds (1 - a marginal seed's core-s / an average seed's)": 1
        - marginal / average,
        "seeds: core-s per seed, 3 seeds in one run / 1 seed alone": average / one,
        "seeds: a later seed's own start, its data and learner built (s)": figures[3]["later_start_s"],
    }, figures


def later_seed_start(storage: Path, name: str) -> float:
    """The slowest later seed's own start in a sweep's run: its data and its learner (model, DeepSpeed), built
    in the configuration's running process (its stages of timing/startup)."""
    from orchestrator.tracking import Tracker, default_tracking_uri

    tracker = Tracker(default_tracking_uri(str(storage)), "rlvr-explore")
    runs = tracker.client.search_runs([tracker.experiment_id], tags_filter(sweep=name, kind="trial"))
    later = [r for r in runs if int(r.data.params.get("seed", 0)) > 0]
    return max(
        (
            r.data.metrics.get("timing/startup_learner", 0.0) + r.data.metrics.get("timing/startup_data", 0.0)
            for r in later
        ),
        default=0.0,
    )


def sweep_compute(storage: Path, name: str, spec: str) -> dict[str, float]:
    """The sweep's wall time, and the share of it its trials spent in RL steps: the trials' summed step
    times over (wall x the configurations that run at once), read back from MLflow."""
    from orchestrator.spec import load_sweep_spec
    from orchestrator.tracking import Tracker, default_tracking_uri

    _, search, _ = load_sweep_spec(spec, check_files=False)
    tracker = Tracker(default_tracking_uri(str(storage)), "rlvr-explore")
    runs = tracker.client.search_runs([tracker.experiment_id], tags_filter(sweep=name), max_results=10_000)
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    wall, report = parent.data.metrics["sweep/wall_s"], parent.data.metrics["sweep/report_s"]
    steps = sum(
        v
        for r in runs
        if r.data.tags.get("kind") == "trial"
        for _, v in tracker.metric_history(r.info.run_id, "timing/step")
    )
    at_once = search.max_concurrent_trials  # a configuration's seeds take turns in one run
    return {
        "wall_s": wall,
        "trial_step_s": steps,
        "compute_share": steps / (wall * at_once),
        "report_s": report,
        "report_share": report / (wall + report),
    }


def engine_rows(cfg, quick: bool) -> tuple[dict, dict]:
    from bench.engines import hf_figures, vllm_figures

    # This machine's speed swings by ~10 % from one 0.3 s call to the next: medians of 10 calls moved
    # EAD / fixed between 0.88 and 1.11 from run to run; 24 paired rounds keep it within 1 +- 0.015.
    repeats = 8 if quick else 24
    console.print(f"[bold]engines[/bold]: {repeats} rounds of interleaved calls (the service pair: {2 * repeats})")
    hf, vllm = hf_figures(cfg, repeats), vllm_figures(cfg, repeats)
    rows = {
        "generation EAD / fixed, hf": hf["ead_over_fixed"],
        "generation EAD recipe / T = 1, hf (longer samples)": hf["ead_recipe_over_fixed"],
        "generation EAD / fixed, vllm": vllm if isinstance(vllm, str) else vllm["ead_over_fixed"],
        "throughput service / direct, hf": hf["service_over_direct"],
        "weight push gloo / object store, hf": hf["gloo_over_object_store"],
    }
    if not isinstance(vllm, str):
        rows["generation EAD recipe / T = 1, vllm (longer samples)"] = vllm["ead_recipe_over_fixed"]
    return rows, {"hf": hf, "vllm": vllm}


def refusal_seconds(spec: str, repeats: int = 3) -> float:
    """Median seconds from starting `python -m orchestrator.train SPEC` with an unknown key to its exit."""
    import statistics
    import subprocess

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.train", spec, "--set", "learner.no_such_key=1"],
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - start)
        assert done.returncode == 2, done.stdout + done.stderr
    return statistics.median(times)


def trial_rows(spec: str, storage: Path, steps: int, overrides: list[str]) -> tuple[dict, dict]:
    from bench.trials import algorithm_ratios

    console.print(f"[bold]trials[/bold]: {', '.join(ALGORITHMS)}, {steps} steps each")
    figures, ratios = algorithm_ratios(spec, str(storage), steps, overrides, ALGORITHMS)
    main = figures[ALGORITHMS[0]]
    rows = {
        "orchestration overhead (steady wall / compute)": main["overhead"],
        "trial start-up (s)": main["startup_s"],
        "bad input refused, from the command's start (s)": refusal_seconds(spec),
        **{f"step time {key}": value for key, value in ratios.items()},
        "weight sync / step": main["sync_share_of_step"],
        "checkpoint / its interval": main["checkpoint_share_of_interval"],
        "report + logging / wall": main["report_logging_share_of_wall"],
    }
    return rows, {"algorithms": figures, "ratios": ratios}


def peer_rows(spec: str, storage: Path, steps: int, quick: bool, overrides: list[str]) -> tuple[dict, dict]:
    from bench.peers import peers_figures

    rounds = 1 if quick else 2
    console.print(
        f"[bold]peers[/bold]: TRL's GRPOTrainer and one trial (synchronous, then overlapped), {steps} "
        f"steps each, {rounds} round(s)"
    )
    figures = peers_figures(spec, storage, steps, rounds, overrides)
    floor = figures["ray train floor / trl, start-up"]
    return {
        "peers: s per RL step, ours / TRL": figures["ours / trl, s per step"],
        "peers: s per RL step, ours with rollout.overlap 1 / TRL": figures["ours, overlap 1 / trl, s per step"],
        "peers: start-up, ours / TRL": figures["ours / trl, start-up"],
        "peers: start-up, Ray Train's own (an empty train function) / TRL": floor,
    }, figures


def learner_rows(cfg, quick: bool) -> tuple[dict, dict]:
    from bench.learner_costs import learner_figures, push_figures
    from trainables.data.models import resolve_model_path

    console.print("[bold]learner[/bold]: old log-probs + update, chunked and full-logits passes, fresh processes")
    figures = learner_figures(cfg, quick, str(resolve_model_path(cfg.model, cfg.cache_dir)))
    console.print("[bold]learner[/bold]: the weight push, by buckets and by a whole copy, fresh processes")
    figures["push"] = push_figures(cfg)
    return {
        "weight push peak extra memory / model size, ZeRO-3": figures["push"]["buckets"]["extra_over_model"],
        "weight push peak extra memory / model size, whole-model copy first": figures["push"]["whole"][
            "extra_over_model"
        ],
        "learner memory per response token / fp32 logits row (V = 151,936)": figures["chunked"][
            "per_token_over_logits_row"
        ],
        "learner memory per response token / fp32 logits row, full-logits pass": figures["full"][
            "per_token_over_logits_row"
        ],
        "learner update tokens/s, chunked / full-logits pass": figures["speed"]["chunked_over_full"],
    }, figures


def decision_rows(quick: bool, tune: bool = True) -> tuple[dict, dict]:
    """The decisions section; `tune`: also the new procedure end to end through Ray Tune (starts Ray)."""
    from bench.simulated_sweeps import (
        NEW,
        PROCEDURES,
        allocation_figures,
        decision_figures,
        tune_figures,
        world_figures,
    )

    figures = decision_figures(quick)
    console.print(
        f"[bold]decisions[/bold]: {figures['sweeps']} simulated sweeps per scenario and procedure, "
        f"seed SD {figures['seed_sd']}"
    )
    print_procedures(figures)
    if tune:
        figures["tune"] = tune_figures(2 if quick else 10)
        console.print(
            f"through Ray Tune and Optuna ({figures['tune']['sweeps']} sweeps, the new procedure, a "
            f"configuration with x > 0.5 better by 2 SDs): P(a better one confirmed) "
            f"{figures['tune']['better_confirmed']:.2f}, P(false verdict) "
            f"{figures['tune']['false_verdict']:.2f}, {figures['tune']['trial_steps']:.0f} trial-steps "
            "a sweep",
            highlight=False,
        )
    sc, old, wide = figures["scenarios"], next(iter(PROCEDURES)), list(PROCEDURES)[-1]
    two = sc["one better by 2 SDs"]
    rows = {
        "decisions: P(false better/worse), all equal, new": sc["all equal"][NEW]["false_verdict"],
        "decisions: P(false better/worse), all equal, old": sc["all equal"][old]["false_verdict"],
        "decisions: P(truly best pruned), 1 SD better, new": sc["one better by 1 SD"][NEW]["best_pruned"],
        "decisions: P(truly best pruned), 1 SD better, old": sc["one better by 1 SD"][old]["best_pruned"],
        "decisions: P(truly best confirmed better), 2 SDs, new up to 12 pairs": two[wide]["best_confirmed"],
        "decisions: P(truly best confirmed better), 2 SDs, new (default, up to 6 pairs)": two[NEW]["best_confirmed"],
        "decisions: P(truly best confirmed better), 2 SDs, old": two[old]["best_confirmed"],
        "decisions: trial-steps new / old, 2 SDs": two[NEW]["trial_steps"] / two[old]["trial_steps"],
    }
    for row, value in rows.items():
        if row.startswith("decisions: P("):
            MC_SE[row] = (value * (1 - value) / figures["sweeps"]) ** 0.5
    figures["worlds"] = world_figures(quick)
    print_worlds(figures["worlds"])
    figures["allocations"] = allocation_figures(quick)
    print_allocations(figures["allocations"])
    return {**rows, **world_rows(figures["worlds"]["worlds"])}, figures


WORLD_COLUMNS = {
    "false_verdict": "P(false verdict), all equal",
    "better_when_worse": "P(better), every other worse",
    "best_pruned": "P(best pruned), 1 SD",
    "best_confirmed": "P(best chosen, confirmed), 2 SDs",
    "seed_runs": "seed-runs, 2 SDs",
    "pruning_saves": "rungs save, 2 SDs",
}


def print_worlds(figures: dict) -> None:
    """One row per world: the default procedure's rates, each ± its Monte Carlo standard error."""
    table = number_table(
        f"decisions by world: the default procedure, {figures['sweeps']} simulated sweeps per "
        "scenario (± Monte Carlo standard error)",
        ["world", *WORLD_COLUMNS.values()],
    )
    digits = {key: 1 if key == "seed_runs" else 3 for key in WORLD_COLUMNS}
    for name, w in figures["worlds"].items():
        table.add_row(name, *(f"{w[key][0]:.{digits[key]}f} ± {w[key][1]:.{digits[key]}f}" for key in WORLD_COLUMNS))
    console.print(table)


def print_procedures(figures: dict) -> None:
    """Each scenario x procedure: its rates and compute."""
    table = number_table(
        "decisions: the sweep's procedure on configurations of known truth",
        ["scenario", "procedure", "P(false better/worse)", "P(best confirmed)", "P(best pruned)", "trial-steps"],
    )
    for scenario, procs in figures["scenarios"].items():
        for proc, r in procs.items():
            table.add_row(
                scenario,
                proc,
                f"{r['false_verdict']:.3f}",
                f"{r['best_confirmed']:.3f}",
                f"{r['best_pruned']:.3f}",
                f"{r['trial_steps']:.0f}",
            )
    console.print(table)


def print_allocations(figures: dict) -> None:
    """Power against compute: each allocation of seeds in its worst world, and its cost (docs/performance.md,
    "How the default spends its seeds")."""
    table = number_table(
        f"decisions by allocation of seeds: {figures['sweeps']} simulated sweeps per world and scenario",
        ["allocation", "P(best chosen, confirmed), 2 SDs, worst world", "P(false verdict), worst", "seed-runs"],
    )
    for name, a in figures["allocations"].items():
        best, false, runs = a["worst_best_confirmed"], a["max_false_verdict"], a["seed_runs"]
        table.add_row(name, f"{best[0]:.3f} ± {best[1]:.3f} ({a['worst_world']})", f"{false[0]:.3f}", f"{runs[0]:.1f}")
    console.print(table)


def world_rows(worlds: dict) -> dict[str, float]:
    """The worst world's rates for the default against their targets (each world's standard error kept
    in MC_SE), and the compute the rungs save in the calibrated world."""
    from bench.simulated_sweeps import CALIBRATED

    picks = {
        "decisions: P(false better/worse), all equal, new (default), worst world": ("false_verdict", max),
        "decisions: P(truly best chosen and confirmed better), 2 SDs, new (default), worst world": (
            "best_confirmed",
            min,
        ),
        "decisions: P(truly best pruned), 1 SD better, new (default), worst world": ("best_pruned", max),
    }
    rows = {}
    for row, (key, worst) in picks.items():
        name = worst(worlds, key=lambda w: worlds[w][key][0])
        rows[row], MC_SE[row] = worlds[name][key]
        console.print(f"{row}: {name}", highlight=False)
    row = "decisions: compute saved by the interval rungs vs none, new (default), 2 SDs, calibrated world"
    rows[row] = worlds[CALIBRATED]["pruning_saves"][0]
    return rows


def print_table(rows: dict, title: str) -> None:
    table = number_table(title, ["row", "value", "target", "verdict"])
    for row in TARGETS:
        if row in rows:
            value, target = rows[row], TARGETS[row]
            shown = (
                value if isinstance(value, str) else f"{value:.3f}" + (f" ± {MC_SE[row]:.3f}" if row in MC_SE else "")
            )
            table.add_row(row, shown, f"{target[0]} {target[1]:g}" if target else "", verdict(row, value))
    console.print(table)


def print_phases(figures: dict) -> None:
    table = number_table("steady-state step, share of each phase", ["phase", *figures])
    phases = next(iter(figures.values()))["phase_share_of_step"]
    for phase in phases:
        table.add_row(phase, *(f"{f['phase_share_of_step'][phase]:.1%}" for f in figures.values()))
    table.add_row("mean step (s)", *(f"{f['mean_step_s']:.2f}" for f in figures.values()))
    table.add_row("loop wall per step (s)", *(f"{f['mean_step_wall_s']:.2f}" for f in figures.values()))
    table.add_row("encoder busy (s per step)", *(f"{f['encoder_s_per_step']:.2f}" for f in figures.values()))
    console.print(table)
    table = number_table("start-up, seconds per stage (timing/startup_*)", ["stage", *figures])
    for stage in next(iter(figures.values()))["startup_stages_s"]:
        table.add_row(stage, *(f"{f['startup_stages_s'][stage]:.1f}" for f in figures.values()))
    table.add_row("total", *(f"{f['startup_s']:.1f}" for f in figures.values()))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec", nargs="?", default="search_spaces/ead.yaml")
    parser.add_argument("--quick", action="store_true", help="the reduced run (CI): fewer steps and repeats")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--steps", type=int, help="RL steps per trial (default 12; --quick 5)")
    parser.add_argument("--storage", default="runs/bench", help="where the bench's runs and JSON go")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field of the trials and engines, as in orchestrator.train",
    )
    args = parser.parse_args(argv)
    sections, steps = checked_args(parser, args)

    from orchestrator.spec import SpecError, load_trial_spec

    try:
        cfg = load_trial_spec(args.spec, args.overrides)
    except SpecError as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    storage = Path(args.storage).resolve() / time.strftime("%Y%m%d-%H%M%S")
    storage.mkdir(parents=True, exist_ok=True)
    rows, details = {}, {}
    start = time.perf_counter()
    run = {
        "sweep": lambda: sweep_rows(args.spec, storage / "sweep", args.quick),
        "seeds": lambda: seed_rows(args.spec, storage / "seeds", args.quick),
        "engines": lambda: engine_rows(cfg, args.quick),
        "learner": lambda: learner_rows(cfg, args.quick),
        "decisions": lambda: decision_rows(args.quick),
        "peers": lambda: peer_rows(args.spec, storage / "peers", steps, args.quick, args.overrides),
        "trials": lambda: trial_rows(args.spec, storage / "trials", steps, args.overrides),
    }
    for section in [s for s in SECTIONS if s in sections]:  # the sweeps first: each starts its own Ray cluster
        found, details[section] = run[section]()
        rows.update(found)
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    title = f"python -m bench{' --quick' if args.quick else ''} {args.spec}, seed {cfg.seed}, {machine}"
    if "trials" in details:
        print_phases(details["trials"]["algorithms"])
    print_table(rows, title)
    record = {
        "title": title,
        "seed": cfg.seed,
        "quick": args.quick,
        "steps": steps,
        "seconds": time.perf_counter() - start,
        "rows": judged(rows),
        "details": details,
    }
    (storage / "bench.json").write_text(json.dumps(record, indent=2, default=str))
    console.print(f"written: {storage / 'bench.json'} ({record['seconds']:.0f} s)")
    return 0


def judged(rows: dict[str, float | str]) -> dict[str, dict]:
    """Each row's value with its target and verdict (and a simulated rate's Monte Carlo error), for bench.json."""
    return {
        row: {
            "value": value,
            "target": TARGETS[row],
            "verdict": verdict(row, value),
            **({"mc_se": MC_SE[row]} if row in MC_SE else {}),
        }
        for row, value in rows.items()
    }


def checked_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], int]:
    """The sections to run and the trials' steps; a bad choice ends the bench with the parser's message."""
    sections = args.only.split(",")
    if args.spec in SECTIONS:  # `python -m bench decisions`: one section, on the default spec
        sections, args.spec = [args.spec], parser.get_default("spec")
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"--only: unknown section(s) {sorted(unknown)}; expected some of {SECTIONS}")
    steps = args.steps or (5 if args.quick else 12)
    if steps < 5:
        parser.error("--steps must be >= 5: two warm-up steps, a steady state, a final step")
    return sections, steps


if __name__ == "__main__":  # the guard also keeps vLLM's spawned workers from rerunning the bench
    sys.exit(main())
