"""Notices that part of a trial is about to go, acted on at the next step boundary.

Two kinds reach a trial before its resources vanish:

- a **node drain**: the autoscaler, KubeRay or a person announces a spot reclaim with
  `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N`. Ray Train's
  own watcher tells the learner ranks when a node hosting one of them drains; rank 0 looks for drains
  of the rollout engines' nodes itself. One all-reduce a step makes every rank act on any of them.
- **SIGTERM to a learner's process** (a pod deleted with a grace period): Ray's default handler ends
  the process at once, losing the steps since the last checkpoint; here it becomes a notice.

Either way every rank checkpoints at the next step boundary, once per notice. Then the trial goes on
elsewhere: for a drain Ray Train restarts the learner ranks from that checkpoint off the draining
node at its deadline, and Ray restarts a lost engine in its placement group on another node; for a
SIGTERM the ranks raise `WorkerTerminating`, and Ray Train restarts them from the checkpoint at once.
"""

from __future__ import annotations

import signal
import threading
from datetime import datetime

import pyarrow.fs
import ray
import torch
import torch.distributed as dist

from trainables.runtime.ranks import reduce_max

TERMINATING = threading.Event()  # this process got SIGTERM while training
TRAINING = threading.Event()  # the training loop runs in this process: a SIGTERM outside it ends the process


class WorkerTerminating(RuntimeError):
    """A learner rank's process got SIGTERM: the trial checkpointed and restarts from it elsewhere."""


def install_sigterm_notice() -> None:
    """On the worker actor's main thread (the only one a signal handler can be set from): SIGTERM while
    training marks this process as terminating instead of ending it; a second one, or one outside
    training (Ray shutting its workers down), ends it as Ray's own handler does."""
    ray_handler = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame) -> None:
        if TERMINATING.is_set() or not TRAINING.is_set():
            return ray_handler(signum, frame) if callable(ray_handler) else signal.default_int_handler(signum, frame)
        TERMINATING.set()  # said at the step boundary, with the checkpoint: Ray's own stop of a trial
        # (a pruned one) also sends SIGTERM, then ends the process before that boundary

    signal.signal(signal.SIGTERM, on_sigterm)


def arm_sigterm_notice() -> None:
    """From the training thread: have this Ray Train worker's main thread install the handler."""
    worker = ray.get_runtime_context().current_actor
    ray.get(worker.execute.remote(install_sigterm_notice))


def draining_nodes() -> dict[str, int]:
    """Ray's draining nodes as {node id: deadline in epoch ms (0: none)}. A private API: Ray Train's
    preemption watcher reads the same."""
    return ray._private.state.state.get_draining_nodes()


def learner_drains() -> set[str]:
    """The draining nodes that host this trial's ranks, as Ray Train's preemption watcher told this
    worker. Read from the worker's own context (a private API): `ray.train.get_preemption_info()`
    would add a barrier through an actor to every step; the ranks agree by `reduce_flags` instead."""
    from ray.train.v2._internal.execution.context import get_train_context

    info = get_train_context().preemption_context.preemption_info
    return set(info.preempted_node_ids) if info is not None else set()


def reduce_flags(flags: list[bool]) -> list[bool]:
    """Each flag set on any rank."""
    if not dist.is_initialized():
        return flags
    t = torch.tensor([float(f) for f in flags], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


class Notices:
    """What the ranks agree, at a step boundary, to checkpoint for; each notice acted on once."""

    def __init__(self, rank: int, engines: list):
        self.rank, self.engines = rank, engines
        self.handled: set[str] = set()

    def engine_drains(self) -> set[str]:
        """Rank 0: the draining nodes that host one of the trial's engines."""
        if self.rank != 0 or not (draining := draining_nodes()):
            return set()
        try:
            nodes = {h["node_id"] for h in ray.get([e.health.remote() for e in self.engines], timeout=30)}
        except (ray.exceptions.RayError, TimeoutError):  # an engine already gone: the loss is handled as a fault
            return set()
        return nodes & set(draining)

    def new(self) -> str | None:
        """Collective: why to checkpoint now (None: nothing new). Every rank calls it at every step boundary."""
        learner_nodes, engine_nodes = learner_drains(), self.engine_drains()
        learners_draining, engines_draining, terminating = reduce_flags(
            [bool(learner_nodes - self.handled), bool(engine_nodes - self.handled), TERMINATING.is_set()]
        )
        reasons = []
        if learners_draining:
            reasons.append("a learner rank's node drains")
        if engines_draining:
            reasons.append("an engine's node drains")
        if terminating and "sigterm" not in self.handled:
            reasons.append("a learner process got SIGTERM")
        self.handled |= learner_nodes | engine_nodes | ({"sigterm"} if terminating else set())
        return "; ".join(reasons) or None

    @property
    def terminating(self) -> bool:
        return "sigterm" in self.handled


def stop_asked(rank: int, stop_file, save_by, last_step_seconds: float | None, save_seconds: float | None) -> bool:
    """A stop file (pyarrow filesystem, path: the driver got SIGTERM) or `checkpoint.save_by` too close
    to run another step and save. Rank 0 decides and every rank follows, so all of them stop at the same
    step boundary."""
    stop = False
    if rank == 0:
        if stop_file:
            fs, path = stop_file
            stop = fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound
        if save_by is not None and last_step_seconds is not None:
            margin = 2 * last_step_seconds + (save_seconds or last_step_seconds)
            stop = stop or (save_by - datetime.now(save_by.tzinfo)).total_seconds() < margin
    return reduce_max(float(stop)) > 0
