"""Calls to a trial's actors (rollout engines, verifier, encoder) with a time limit, so that a hung
actor (a deadlocked engine, a stuck kernel, a stopped process) becomes a retried fault, not a trial
that waits forever: past `checkpoint.actor_timeout_s` the actor is killed with restart allowed, and
Ray brings it back. The verifier and the encoder retry their pending calls on the new process
(`max_task_retries=-1`); an engine's call fails and the trial re-syncs its weights and asks again.
"""

from __future__ import annotations

from typing import Any

import ray

from trainables.runtime.errors import TrialError


class ActorHung(TrialError):
    """An actor gave no answer within the time limit; it has been restarted."""


def restart_hung(actor, what: str, timeout_s: float) -> ActorHung:
    """Kill a hung actor so that Ray restarts it; the error that says so."""
    ray.kill(actor, no_restart=False)
    print(f"{what}: no answer in {timeout_s:.0f} s; restarted the actor", flush=True)
    return ActorHung(f"{what}: no answer in {timeout_s:.0f} s (checkpoint.actor_timeout_s); the actor was restarted")


def get(actor, ref, timeout_s: float, what: str) -> Any:
    """`ray.get(ref)` from a restartable actor whose calls Ray retries: once restarted after a hang,
    the same call is awaited again; a second hang fails the step."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        restart_hung(actor, what, timeout_s)
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise restart_hung(actor, what, timeout_s) from None
