"""Why a trial stopped, in one line: the errors a trial raises on purpose, and how a command finds
one inside what Ray Train hands back (a worker group's failures, each wrapped with its traceback)."""

from __future__ import annotations


class TrialError(RuntimeError):
    """A trial stopped for a reason it states in one line; the command prints the line, not a traceback."""


class NonFiniteError(TrialError):
    """The update's gradient norm or the policy's statistics stopped being finite: the trial stops."""


class CheckpointError(TrialError):
    """A checkpoint that cannot be written, or no intact one to resume from: the trial stops."""


class UnusableCheckpoint(CheckpointError):
    """No checkpoint to resume from is intact, readable and sealed by the product: bad input (exit 2)."""


def stated(error: BaseException | None) -> TrialError | None:
    """The TrialError behind `error` (a Ray Train WorkerGroupError holds one per failed worker), if any."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, TrialError):
            return e
        todo += [getattr(e, "_base_exc", None), e.__cause__, *getattr(e, "worker_failures", {}).values()]
    return None


# How torch's zip writer (and DeepSpeed, through it) words a write cut short: "file write failed",
# "PytorchStreamWriter failed writing file ...", "[enforce fail at inline_container.cc] unexpected pos".
WRITE_MARKERS = (
    "write failed",
    "failed writing",
    "PytorchStreamWriter",
    "inline_container",
    "No space left",
    "Disk quota",
)


def write_failure(error: BaseException, folder: str, step: int) -> CheckpointError | None:
    """A checkpoint write that failed (a full disk, a quota, a lost mount) as one line with the space
    left; None for an error that is not a failed write. torch and DeepSpeed report a failed write as a
    RuntimeError (WRITE_MARKERS), the filesystem as an OSError."""
    import shutil

    if not isinstance(error, OSError) and not (
        isinstance(error, RuntimeError) and any(marker in str(error) for marker in WRITE_MARKERS)
    ):
        return None
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.0f} MiB free there"
    except OSError:
        free = "its disk unreadable"
    first = (str(error).splitlines() or [type(error).__name__])[0]
    return CheckpointError(f"checkpoint: cannot write step {step + 1} in {folder} ({free}): {first}")
