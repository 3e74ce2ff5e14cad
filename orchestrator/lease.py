"""A run's folder (local or bucket, through pyarrow) guarded: one command at a time, and a resume only
with the settings the run started with.

A `train`, `sweep` or `study` takes `<storage>/<name>/lease.json` before it touches anything there
and renews it every TTL_S / 3 seconds; a second command of the same name and storage is refused in
one line while the lease is live. The lease outlives a crash by at most TTL_S (at once when its
holder was a process of this machine that is gone), so a preempted run can always be resumed.

Two commands started in the same instant both write, then read back after SETTLE_S: the last
writer holds the lease and the other is refused (a bucket without conditional writes allows no
stronger guarantee).

`settings.json` keeps what the run started with; `--resume` with other settings is refused, naming
the fields, unless forced.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import uuid

import pyarrow.fs

from orchestrator.inputs import SpecError

HELD: list[Lease] = []  # this process's leases: `release_all` when its command returns
LEASE_FILE = "lease.json"
SETTINGS_FILE = "settings.json"
TTL_S = 60.0
SETTLE_S = 0.5


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class Lease:
    def __init__(self, folder_uri: str, ttl_s: float = TTL_S):
        self.uri = f"{folder_uri.rstrip('/')}/{LEASE_FILE}"
        self.fs, self.path = pyarrow.fs.FileSystem.from_uri(self.uri)
        self.ttl_s = ttl_s
        self.me = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = threading.Event()

    def holder(self) -> dict | None:
        """The lease as written (None: none, or unreadable, which counts as none)."""
        try:
            with self.fs.open_input_stream(self.path) as f:
                held = json.loads(f.read())
            return held if isinstance(held, dict) and {"owner", "host", "pid", "expires"} <= held.keys() else None
        except (FileNotFoundError, OSError, ValueError):
            return None

    def live(self, held: dict | None) -> bool:
        """Whether another process holds a lease that still counts (this process's earlier command, run
        in-process as the tests do, has ended)."""
        if held is None or held["expires"] < time.time():
            return False
        if held["host"] != self.me["host"]:
            return True
        return int(held["pid"]) != self.me["pid"] and process_alive(int(held["pid"]))

    def _write(self) -> None:
        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self.path) as f:
            f.write(json.dumps({**self.me, "expires": time.time() + self.ttl_s}).encode())

    def check_free(self, what: str) -> None:
        """SpecError naming who holds the lease when another live command does: `what` is running."""
        if self.live(held := self.holder()):
            raise SpecError(
                f"{what}: is running ({held['host']}, pid {held['pid']}; its lease in {self.uri} "
                f"is renewed while it runs and lapses {self.ttl_s:.0f} s after it stops): wait for "
                "it, stop it, or use another name"
            )

    def acquire(self, what: str) -> None:
        """Take the lease or raise SpecError naming who holds it; renewed until `release` or exit."""
        for earlier in [lease for lease in HELD if lease.uri == self.uri]:
            earlier.release()
        for _ in range(2):
            self.check_free(what)
            self._write()
            time.sleep(SETTLE_S)
            if (self.holder() or {}).get("owner") == self.me["owner"]:
                break
        else:
            raise SpecError(
                f"{what}: another command took {self.uri} at the same moment; wait for it or use another name"
            )
        threading.Thread(target=self._renew, daemon=True, name="lease").start()
        HELD.append(self)
        atexit.register(self.release)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._write()
            except OSError:
                pass  # a storage hiccup: the next renewal tries again, well inside the TTL

    def release(self) -> None:
        self._stop.set()
        if self in HELD:
            HELD.remove(self)
        held = self.holder()
        if held and held["owner"] == self.me["owner"]:
            self.fs.delete_file(self.path)


def release_all() -> None:
    """Release every lease this process holds (a command has returned or failed)."""
    for lease in list(HELD):
        lease.release()


def check_settings(folder_uri: str, settings: dict, *, resume: bool, force: bool) -> None:
    """On --resume, refuse settings that differ from the run's first ones (unless `force`); then record them."""
    from orchestrator.tracking import flatten

    fs, path = pyarrow.fs.FileSystem.from_uri(f"{folder_uri.rstrip('/')}/{SETTINGS_FILE}")
    if resume and fs.get_file_info(path).type == pyarrow.fs.FileType.File:
        try:
            with fs.open_input_stream(path) as f:
                saved = flatten(json.loads(f.read()))
        except (OSError, ValueError, RecursionError, AttributeError) as e:  # AttributeError: JSON but not an object
            raise SpecError(
                f"--resume: {folder_uri}/{SETTINGS_FILE} does not hold the run's settings "
                f"({type(e).__name__}); left as it is"
            ) from None
        now = flatten(json.loads(json.dumps(settings)))  # as JSON keeps them: tuples are lists
        differ = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
        if differ and not force:
            shown = ", ".join(f"{k} ({saved.get(k)!r} -> {now.get(k)!r})" for k in differ[:6])
            raise SpecError(
                f"--resume: the settings differ from the run's own in {len(differ)} field(s): {shown}"
                f"{' ...' if len(differ) > 6 else ''}; resume with the same spec, or add --force"
            )
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(settings, indent=1).encode())
