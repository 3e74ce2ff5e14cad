"""Peak memory of a command and every process it starts (Ray's GCS, raylet, workers and actors are
its descendants when it starts its own local cluster).

PSS (proportional set size) splits each shared page among the processes mapping it, so the sum
over the tree is the memory the command really holds; the RSS sum counts the shared torch and
CUDA libraries once per process and overstates it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil

GIB = 1024**3


def tree_memory(root: psutil.Process) -> tuple[int, int]:
    """(PSS, RSS) in bytes summed over `root` and its descendants alive now."""
    pss = rss = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone between the listing and the read
        pss, rss = pss + info.pss, rss + info.rss
    return pss, rss


def process_kind(process: psutil.Process) -> str:
    """What a process is: a Ray worker by the actor or task its title names (`ray::RolloutService`), an
    idle Ray worker as `ray::IDLE`, anything else by its program's name."""
    words = process.cmdline() or [process.name()]
    title = words[0]
    if title.startswith("ray::"):
        return title.split(".")[0]
    return (Path(title).name if not title.endswith("python") else " ".join(Path(w).name for w in words[:3]))[:60]


def tree_cpu(root: psutil.Process, seen: dict[tuple[int, float], tuple[str, float]]) -> None:
    """Into `seen` ((pid, its start time) -> (its kind, CPU seconds, user + system)): `root` and its
    descendants now. A Ray worker's title names the actor it hosts once it hosts one."""
    for process in [root, *root.children(recursive=True)]:
        try:
            with process.oneshot():
                times = process.cpu_times()
                kind = process_kind(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        key = (process.pid, process.create_time())
        earlier = seen.get(key, ("", 0.0))[0]
        seen[key] = (kind if earlier in ("", "ray::IDLE") else earlier, times.user + times.system)


def cpu_by_kind(seen: dict[tuple[int, float], tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """{kind: (processes, CPU seconds)} of a `tree_cpu` record."""
    out: dict[str, tuple[int, float]] = {}
    for kind, seconds in seen.values():
        count, total = out.get(kind, (0, 0.0))
        out[kind] = (count + 1, total + seconds)
    return dict(sorted(out.items(), key=lambda item: -item[1][1]))


def peak_memory(command: list[str], interval_s: float = 0.5, **popen) -> dict[str, float]:
    """Run `command` to its end, sampling its process tree; its peaks in GiB, seconds, exit code, and the
    CPU seconds its processes spent (`core_seconds`: each process's last sample, so a process that exits
    loses at most `interval_s` of its own)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, **popen)
    root = psutil.Process(child.pid)
    peaks, done, cpu = [0, 0], threading.Event(), {}

    def sample():
        while not done.wait(interval_s):
            pss, rss = tree_memory(root)
            peaks[0], peaks[1] = max(peaks[0], pss), max(peaks[1], rss)
            tree_cpu(root, cpu)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = child.wait()
    done.set()
    sampler.join()
    return {
        "peak_pss_gib": peaks[0] / GIB,
        "peak_rss_gib": peaks[1] / GIB,
        "seconds": time.perf_counter() - start,
        "exit_code": code,
        "core_seconds": sum(seconds for _, seconds in cpu.values()),
        "cpu_by_kind": cpu_by_kind(cpu),
    }
