"""python -m orchestrator.train SPEC.yaml [--set key.path=value ...] [--resume]
python -m orchestrator.train --best-of SWEEP_DIR [--steps N] [--set key.path=value ...]

Runs ONE trial as a Ray Train run (final models, debugging), tracked as a top-level MLflow run.
A finished trial's policy is exported as a Hugging Face folder, <storage>/<name>/model; with
`logging.register_as` (set by --best-of) it is logged with the run and registered in MLflow.
`--best-of` trains with the best parameters a sweep found (its best_trial.yaml).
SIGTERM or `checkpoint.save_by` make it checkpoint at the next step boundary and exit with 75;
`--resume` (same spec and storage) continues it from its latest intact checkpoint, in the same
MLflow run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.fs
from rich.table import Table

from orchestrator.cli import later
from orchestrator.console import console, number_table
from orchestrator.lease import Lease, release_all
from orchestrator.preempt import STOPPED_EXIT_CODE
from orchestrator.spec import BEST_SPEC, SpecError, derived_numbers, load_trial_spec
from trainables.config import TrialConfig
from trainables.metrics import SUMMARY_NAMESPACES
from trainables.runtime.errors import UnusableCheckpoint, stated

if TYPE_CHECKING:
    from orchestrator.tracking import Tracker

# Ray, MLflow and the model's libraries load once the spec has passed its checks.
launch, tracking, models = later("orchestrator.launch"), later("orchestrator.tracking"), later("trainables.data.models")


def summary_table(metrics: dict[str, float], title: str) -> Table:
    table = number_table(title, ["metric", "value"])
    for key in sorted(metrics):
        value = metrics[key]
        if isinstance(value, (int, float)) and key.startswith(SUMMARY_NAMESPACES):
            table.add_row(key, f"{value:.4g}")
    return table


def check_fresh(cfg: TrialConfig, resume: bool) -> None:
    """Ray Train continues a run found under the same (storage, name): only do that when asked. A
    storage URI is looked at as a local folder is."""
    fs, path = pyarrow.fs.FileSystem.from_uri(launch.storage_uri(cfg.storage))
    folder = f"{path.rstrip('/')}/{cfg.name}"
    if not resume and fs.get_file_info(folder).type != pyarrow.fs.FileType.NotFound:
        raise SpecError(
            f"name: a run named {cfg.name!r} already exists in {launch.storage_uri(cfg.storage)}; pass "
            f"--resume to continue it, or --set name=NEW for a new run"
        )


def run(cfg: TrialConfig, resume: bool = False, force: bool = False, trust_unsealed: bool = False) -> dict[str, float]:
    """Run (or with `resume` continue) the trial; its final metrics, with progress/preempted = 1 when
    it stopped early for a resume."""
    cfg.storage = launch.storage_uri(cfg.storage)  # the run's identity, wherever it is resumed from
    what = f"trial {cfg.name!r} in {cfg.storage}"
    Lease(launch.run_folder(cfg.storage, cfg.name)).check_free(what)  # one still starting is running, not "exists"
    check_fresh(cfg, resume)
    launch.claim_folder(what, cfg.storage, cfg.name, {"trial": cfg.model_dump(mode="json")}, resume=resume, force=force)
    model_path = models.resolve_model_path(cfg.model, cfg.cache_dir)
    console.print(f"policy: {model_path}")
    store = launch.load_offline(cfg, model_path)  # a store without a usable row is refused before Ray starts
    started_at = time.time()  # start-up: Ray, the engines, the worker group, DeepSpeed
    uri = cfg.logging.tracking_uri or tracking.default_tracking_uri(cfg.storage)
    tracker, stop = launch.start_cluster(
        cfg.storage, cfg.name, cpus=launch.logical_cpus(cfg), tracking_uri=uri, experiment=cfg.logging.experiment
    )
    run_id = tracker.start_trial_run(cfg, tags={"kind": "trial"}, resume=resume)
    state = "errored"
    try:  # the run is closed on every way out: finished, stopped, errored, Ctrl-C
        if store is not None:
            tracker.log_offline_store(run_id, store)
        console.print(
            f"MLflow run {run_id} in {uri}" if run_id else f"[yellow]untracked:[/yellow] MLflow at {uri} is unreachable"
        )
        stop.on_sigterm(lambda: console.print("SIGTERM: checkpointing at the next step boundary, then stopping"))
        start = time.perf_counter()
        result = launch.fit_trial(
            [cfg],
            model_path,
            name=cfg.name,
            tracking_uri=uri,
            run_ids=[run_id],
            store=store,
            stop_file=stop.uri,
            started_at=started_at,
            trust_unsealed=trust_unsealed,
        )
        if result.error:
            raise result.error
        metrics = dict(result.metrics or {})
        state = "stopped" if metrics.get("progress/preempted") else "finished"
    except KeyboardInterrupt:
        state = "stopped"  # its checkpoints stay: --resume continues it
        raise
    finally:
        tracker.finish(run_id, state)
    conclude(cfg, result, metrics, state, time.perf_counter() - start, tracker, run_id)
    return metrics


def conclude(
    cfg: TrialConfig,
    result,
    metrics: dict[str, float],
    state: str,
    seconds: float,
    tracker: Tracker,
    run_id: str | None,
) -> None:
    """What a finished or stopped trial prints, and a finished one's final policy exported."""
    done = int(metrics.get("progress/step", 0))
    console.print(summary_table(metrics, f"trial {cfg.name}: {done}/{cfg.learner.steps} steps in {seconds:.0f} s"))
    console.print(f"checkpoint: {result.checkpoint.path if result.checkpoint else '-'}")
    if state == "stopped":
        console.print(
            f"[yellow]stopped[/yellow] after step {done} with a checkpoint: rerun the same command "
            f"with --resume to continue",
            soft_wrap=True,
        )
    elif result.checkpoint is not None:
        export_final(cfg, result.checkpoint, tracker, run_id)
    console.print(f"MLflow: {tracking.ui_hint(tracker.uri)}", soft_wrap=True)


def export_final(cfg: TrialConfig, checkpoint, tracker: Tracker, run_id: str | None) -> Path:
    """The final policy as a Hugging Face folder; logged and registered when `logging.register_as`."""
    from trainables.export import export_policy

    local = "://" not in cfg.storage
    out = Path(cfg.storage) / cfg.name / "model" if local else Path(cfg.cache_dir).resolve() / "exports" / cfg.name
    with checkpoint.as_directory() as folder:
        export_policy(folder, out)
    console.print(f"policy: {out}  (a Hugging Face folder: transformers, vLLM, orchestrator.evaluate)")
    if cfg.logging.register_as and run_id:
        version = tracker.register_model(run_id, out, cfg.logging.register_as)
        if version:
            console.print(f"registered in MLflow as {cfg.logging.register_as} version {version}")
    return out


def best_of(sweep_dir: str, overrides: list[str], check_files: bool = True) -> TrialConfig:
    """The best trial of a sweep, ready for a longer final run (registered as '<sweep>-best')."""
    spec = Path(sweep_dir) / BEST_SPEC
    if not spec.is_file():
        raise SpecError(f"--best-of: no {BEST_SPEC} in {sweep_dir}; a sweep writes it when it finishes")
    name = Path(sweep_dir).resolve().name
    for line in spec.read_text().splitlines():  # what the sweep decided, and how sure it is
        if not line.startswith("# "):
            break
        console.print(line[2:], highlight=False, soft_wrap=True)
    return load_trial_spec(spec, [f"logging.register_as={name}-best", *overrides], check_files)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.train", description=__doc__.strip())
    parser.add_argument("spec", nargs="?", help="experiment spec (YAML), e.g. search_spaces/ead.yaml")
    parser.add_argument("--best-of", metavar="SWEEP_DIR", help="train with a sweep's best parameters")
    parser.add_argument("--steps", type=int, help="RL steps (with --best-of: usually longer than the sweep's)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field, e.g. --set learner.steps=10 (repeatable)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run of the same name from its latest checkpoint"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --resume: continue even if the spec's settings differ from the run's own",
    )
    parser.add_argument(
        "--trust-unsealed",
        action="store_true",
        help="with --resume: take a checkpoint this product did not seal (one from before seals, or "
        "a colleague's); only for checkpoints you trust",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the spec (not its data files) and print what it amounts to; run nothing",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    try:
        if bool(args.spec) == bool(args.best_of):
            raise SpecError("give a spec or --best-of SWEEP_DIR (one of them)")
        overrides = [
            *([f"learner.steps={args.steps}"] if args.steps is not None else []),
            *args.overrides,
        ]  # --set wins
        check_files = not args.dry_run
        cfg = (
            best_of(args.best_of, overrides, check_files)
            if args.best_of
            else load_trial_spec(args.spec, overrides, check_files)
        )
        if args.dry_run:
            console.print(derived_numbers(cfg), soft_wrap=True)
            return 0
        metrics = run(cfg, resume=args.resume, force=args.force, trust_unsealed=args.trust_unsealed)
    except (SpecError, FileNotFoundError) as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    except Exception as e:  # a trial that stopped for a reason it states: that line, not Ray's traceback
        if (cause := stated(e)) is None:
            raise
        console.print(f"[red]trial stopped:[/red] {cause}", highlight=False, soft_wrap=True)
        return 2 if isinstance(cause, UnusableCheckpoint) else 1
    finally:
        release_all()
    return STOPPED_EXIT_CODE if metrics.get("progress/preempted") else 0


if __name__ == "__main__":
    sys.exit(main())
