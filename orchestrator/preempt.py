"""Stopping for a resume: SIGTERM (a spot instance's notice) makes every trial checkpoint and stop.

The driver cannot reach into the learner ranks, so it leaves a stop file in the run's storage
(local folder or bucket, through pyarrow); rank 0 of each trial looks for it at every step
boundary (`trainables.runtime.notices.stop_asked`), and all ranks checkpoint and leave together.
"""

from __future__ import annotations

import signal
import threading

import pyarrow.fs

STOPPED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped with a checkpoint; run the same command with --resume
STOP_FILE = "stop-requested"
STOPPED_PREFIX = "stopped-"  # + trial id: that trial has checkpointed and stopped (sweeps)


class StopRequest:
    def __init__(self, folder_uri: str):
        self.uri = f"{folder_uri.rstrip('/')}/{STOP_FILE}"
        self.fs, self.path = pyarrow.fs.FileSystem.from_uri(self.uri)

    def clear(self) -> None:
        """A new or resumed run starts without the request that stopped the last one."""
        for name in [STOP_FILE, *(STOPPED_PREFIX + t for t in self.acknowledged())]:
            path = f"{self.folder}/{name}"
            if self.fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
                self.fs.delete_file(path)

    def request(self) -> None:
        self.fs.create_dir(self.folder, recursive=True)
        with self.fs.open_output_stream(self.path) as f:
            f.write(b"SIGTERM\n")

    def on_sigterm(self, announce) -> None:
        """The first SIGTERM requests the stop (after `announce()`); a second one ends the process."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers live in the main thread only (e.g. a trial run inside a test)

        def handler(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            announce()
            self.request()

        signal.signal(signal.SIGTERM, handler)

    # -- a sweep: the trials tell the driver they have checkpointed -------------------------------
    @property
    def folder(self) -> str:
        return self.path.rsplit("/", 1)[0]

    def acknowledge(self, trial_id: str) -> None:
        with self.fs.open_output_stream(f"{self.folder}/{STOPPED_PREFIX}{trial_id}") as f:
            f.write(b"checkpointed\n")

    def acknowledged(self) -> set[str]:
        """Ids of the trials that checkpointed and stopped since the request."""
        selector = pyarrow.fs.FileSelector(self.folder, allow_not_found=True)
        names = (info.base_name for info in self.fs.get_file_info(selector))
        return {n.removeprefix(STOPPED_PREFIX) for n in names if n.startswith(STOPPED_PREFIX)}
