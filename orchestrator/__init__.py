"""The control plane: the commands that train, sweep, study, evaluate and report, on a Ray cluster."""

import os
import sys

# Lines Ray's processes print that tell a user nothing they can act on; the driver's log deduplicator
# drops them. It reads the pattern when Ray is imported, so it is set here, before any command imports
# Ray: Ray Train's drain watcher's note on its restart arguments, the raylet's count of worker processes
# started (a configuration's seeds start their actors together), the placement-group cleaner after a
# pruned trial, and transformers' weight-loading bar in every worker.
QUIET_LINES = "|".join(
    [
        r"has constructor arguments in the object store and max_restarts > 0",
        r"PYTHON worker processes have been started on node",
        r"Ray Train controller actor \(\w+\) is dead\. Cleaning up placement group",
        r"Loading weights: +\d+%",
    ]
)
os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", QUIET_LINES)
# A trial's own lines ("[trial <name>] ..."): each seed's its own, never folded across seeds into one
# line with a coloured "[repeated Nx across cluster]".
os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", r"\[trial [^\]]+\] ")
# Checkpoints and folders may come from someone else: every torch.load in this process reads tensors
# and plain data only, even where a library (DeepSpeed) asks for weights_only=False
# (trainables/runtime/checkpoint.py; the workers too, through launch.WORKER_ENV).
WEIGHTS_ONLY_ENV = {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}
# A dead tracking server costs a command seconds, not MLflow's minutes of retries (the workers too).
MLFLOW_HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
for key, value in {**WEIGHTS_ONLY_ENV, **MLFLOW_HTTP_ENV}.items():
    os.environ.setdefault(key, value)
# Off a terminal (a log file, CI, `nohup`), and always in Ray's workers (their output is a pipe): the
# libraries' progress bars off (the project's own become lines: trainables/progress.py, and a library bar
# that remains writes a line every 30 s), and Ray's worker prefixes without colour codes.
TQDM_OFF_TERMINAL = {"TQDM_MININTERVAL": "30", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "RAY_COLOR_PREFIX": "0"}
if not (sys.stderr.isatty() and sys.stdout.isatty()):
    os.environ.update({k: v for k, v in TQDM_OFF_TERMINAL.items() if k not in os.environ})
# MLflow's bar for each artifact download (the report reads a few small files) says nothing.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
