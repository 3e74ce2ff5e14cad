"""Ray Tune's saved state, sealed (trainables/runtime/seal.py). Tune pickles its experiment (`tuner.pkl`, the
experiment state's cloudpickled fields, the searcher's state) and `--resume` unpickles it, which runs
whatever code it names; a folder someone else wrote must not get that far.

    while a sweep or study runs:  Tune saves its state (every few seconds) into <run>/tune/
                                  the driver copies it, once it stands still, into <run>/tune-sealed/<n>/
                                  with seals.json (each file's HMAC); `current` names the newest copy
    --resume:                     the newest copy is verified file by file (one line naming a file that
                                  fails), then put in place of Tune's files before Tune reads any of them

So only bytes this product wrote and sealed are ever unpickled. State Tune saved after the last copy (a
crash within seconds of a save) is not used: the resume starts from the copy before it, as after a crash
that much earlier, which Tune and the records survive. Under a storage URI no copy is kept yet: `--resume`
says what it is about to unpickle.
"""

from __future__ import annotations

import hmac
import json
import shutil
import threading
from fnmatch import fnmatch
from pathlib import Path

from orchestrator.console import console
from orchestrator.spec import SpecError
from trainables.runtime.seal import seal_key, seal_of

STATE_FILES = (
    "tuner.pkl",
    "experiment_state-*.json",
    "searcher-state-*.pkl",
    "search_gen_state-*.json",
    "callback-states-*.pkl",
)
SEALED, SEALS, CURRENT = "tune-sealed", "seals.json", "current"
POLL_S = 1.0
TRUST_HINT = "pass --trust-unsealed to resume it anyway (only a folder you trust; it is sealed again as it runs)"


def state_files(tune: Path) -> list[Path]:
    """Tune's state files in its folder (the ones a restore unpickles), by name."""
    if not tune.is_dir():
        return []
    return sorted(p for p in tune.iterdir() if p.is_file() and any(fnmatch(p.name, pat) for pat in STATE_FILES))


def signature(files: list[Path]) -> tuple:
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def seal_copy(tune: Path, key: bytes) -> bool:
    """Copy Tune's state files into a new sealed copy beside `tune`, then make it the current one; False when a
    file changed while it was read (Tune saved meanwhile: the next poll tries again)."""
    files = state_files(tune)
    before = signature(files)
    if not files:
        return False
    root = tune.parent / SEALED
    root.mkdir(exist_ok=True)
    number = max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=-1) + 1
    copy = root / str(number)
    copy.mkdir()
    seals = {}
    for path in files:
        data = path.read_bytes()
        (copy / path.name).write_bytes(data)
        seals[path.name] = seal_of(data, key)
    if signature(state_files(tune)) != before:
        shutil.rmtree(copy)
        return False
    (copy / SEALS).write_text(json.dumps(seals, indent=1))
    (root / f"{CURRENT}.tmp").write_text(str(number))
    (root / f"{CURRENT}.tmp").replace(root / CURRENT)  # the switch is one rename
    for old in root.iterdir():
        if old.is_dir() and old.name != str(number):
            shutil.rmtree(old, ignore_errors=True)
    return True


class Sealer:
    """Keeps the sealed copy of `tune` up to date while a Tune experiment runs: a copy whenever the state
    changed and then stood still for a poll; `close()` takes the last one, after Tune's final save."""

    def __init__(self, tune: Path):
        self.tune, self.key = tune, seal_key()
        self.sealed: tuple = ()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="tune-sealer", daemon=True)

    def start(self) -> Sealer:
        self.thread.start()
        return self

    def watch(self) -> None:
        seen: tuple = ()
        while not self.done.wait(POLL_S):
            now = signature(state_files(self.tune))
            if now and now == seen and now != self.sealed:
                self.seal()
            seen = now

    def seal(self) -> None:
        now = signature(state_files(self.tune))
        if seal_copy(self.tune, self.key):
            self.sealed = now

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.seal()


def verified_copy(tune: Path, trust: bool) -> Path | None:
    """The sealed copy to resume from, every file checked against its seal; None with `trust` when there is
    none or one fails (the warning printed). Without `trust` a folder with no copy, or a file whose seal
    fails, is refused in one line naming it."""
    root = tune.parent / SEALED
    current = (root / CURRENT).read_text().strip() if (root / CURRENT).is_file() else ""
    problem = None
    if not current.isdigit() or not (root / current / SEALS).is_file():
        problem = (
            f"{tune} holds Ray Tune's pickled state without this product's seal (written before seals, "
            "or by someone else)"
        )
    else:
        copy, key = root / current, seal_key()
        seals = json.loads((copy / SEALS).read_text())
        for name, mac in seals.items():
            path = copy / Path(name).name  # a name from the file stays inside the copy
            if not path.is_file() or not hmac.compare_digest(seal_of(path.read_bytes(), key), str(mac)):
                problem = (
                    f"{path} does not carry this product's seal (changed after it was written, or sealed "
                    "with another key)"
                )
                break
    if problem is None:
        return copy
    if not trust:
        raise SpecError(f"--resume: {problem}; restoring it would run the code it names; {TRUST_HINT}")
    console.print(
        f"[yellow]--resume --trust-unsealed: {problem}; restoring it as it is: it runs the code it names[/yellow]",
        soft_wrap=True,
    )
    return None


def put_back(tune: Path, copy: Path) -> None:
    """Tune's state files replaced by the sealed copy's, so that Tune reads only sealed bytes; a save after the
    copy was taken is dropped, said in one line."""
    sealed = set(json.loads((copy / SEALS).read_text()))
    later = [
        p.name for p in state_files(tune) if p.name not in sealed or p.read_bytes() != (copy / p.name).read_bytes()
    ]
    for path in state_files(tune):
        path.unlink()
    for name in sealed:
        shutil.copyfile(copy / Path(name).name, tune / Path(name).name)
    if later:
        console.print(
            f"--resume: Ray Tune's state as of its last sealed save; a later save ({', '.join(later)}) is not used",
            highlight=False,
            soft_wrap=True,
        )
