"""The command lines' edge: the flags a sweep and a study share, and bad input said in one line with exit
code 2. Light on purpose: a command checks its input before it imports Ray, MLflow or torch (`later`),
so a refusal comes at once.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from orchestrator.console import console
from orchestrator.inputs import SpecError
from orchestrator.spec import MAX_CONFIGURATIONS, MAX_SEEDS_PER_CONFIG


class ExperimentFailed(RuntimeError):
    """Every trial failed: said in one line, with where the trials' errors are."""


class later:  # noqa: N801 - used as a module
    """A module imported at its first use: `tune = later("ray.tune")`, then `tune.Tuner(...)`."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


def parser(prog: str, doc: str, kind: str, example: str, count: str) -> argparse.ArgumentParser:
    """The command line a sweep and a study share; `count` is the flag for how many run at once."""
    p = argparse.ArgumentParser(
        prog=prog, description=doc.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("spec", help=f"experiment spec with a {kind}: section, e.g. {example}")
    p.add_argument("--name", help=f"{'sweep' if kind == 'search' else kind} name (default: the spec's name)")
    p.add_argument("--storage", help="folder or URI holding it (default: the spec's storage)")
    p.add_argument("--max-concurrent", type=int, help=f"{count} at once (default: the spec's)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite inside the storage)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a base trial field, e.g. --set learner.steps=10 (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="check the spec and print what would run; start nothing")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the one of the same name and storage (unfinished trials from their checkpoints), from "
        "Ray Tune's state as this product sealed it (docs/operations.md)",
    )
    p.add_argument(
        "--trust-unsealed",
        action="store_true",
        help="with --resume: restore Ray Tune's state and let its trials resume from checkpoints that carry no "
        "valid seal of yours (written before seals, or by a colleague under another key); only for folders you trust",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --resume: continue even if the spec's settings differ from the ones it started with",
    )
    return p


def closes_pools(run: Callable[..., int]) -> Callable[..., int]:
    """A command's `run`: the rollout pools of the experiments it started stop when it returns or raises
    (`experiment.close_pools`; nothing to do, and nothing imported, when it started none)."""

    @functools.wraps(run)
    def wrapped(*args, **kwargs) -> int:
        try:
            return run(*args, **kwargs)
        finally:
            if (experiment := sys.modules.get("orchestrator.experiment")) is not None:
                experiment.close_pools()

    return wrapped


def cli(run, parser_: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse, run, and turn bad input into one line and exit code 2."""
    args = parser_.parse_args(argv)
    try:
        for flag, most in (
            ("max_concurrent", MAX_CONFIGURATIONS),
            ("seeds", MAX_SEEDS_PER_CONFIG),
            ("num_samples", MAX_CONFIGURATIONS),
        ):
            if getattr(args, flag, None) is not None and not 1 <= getattr(args, flag) <= most:
                raise SpecError(f"--{flag.replace('_', '-')} must be between 1 and {most} (got {getattr(args, flag)})")
        return run(args.spec, args)
    except BaseException as e:  # the experiment's MLflow run never stays "running" after its command ended
        if (experiment := sys.modules.get("orchestrator.experiment")) is not None:
            for exp in experiment.STARTED:
                exp.tracker.close_if_running(exp.parent, "stopped" if isinstance(e, KeyboardInterrupt) else "errored")
        if not isinstance(e, (SpecError, FileNotFoundError, ExperimentFailed)):
            raise
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    finally:
        if (experiment := sys.modules.get("orchestrator.experiment")) is not None:
            experiment.close_pools()
            experiment.STARTED.clear()
        if (lease := sys.modules.get("orchestrator.lease")) is not None:
            lease.release_all()
