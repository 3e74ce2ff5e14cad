"""A learner rank's side of the rollout service: rollouts from its engine at the learner's weights,
the weight push to every engine, and the recovery of a lost or hung engine (re-sync, then retry).

Ray restarts a dead engine with its initial weights; every rank learns of a loss through an
all-reduce, all re-sync together, and only the ranks without rollouts ask again.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import ray
import torch

from trainables.rollout.push import WEIGHT_PUSHES, learner_weights, weight_push
from trainables.rollout.service import StaleWeightsError, engines_removed
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.rollout.weight_sync import WeightGroupError
from trainables.runtime import calls
from trainables.runtime.ranks import barrier, reduce_max

SERVICE_RETRIES = 3  # rollout-service losses survived within one call before the step fails
SERVICE_RESTART_TIMEOUT_S = 300
SERVICE_RETRY_PAUSE_S = 2.0  # a restarting actor refuses calls at once (ActorUnavailableError): wait, then push


class TrialStopped(RuntimeError):
    """The trial was stopped from outside (its rollout engines removed or taken back): not a fault to retry."""


VERSION_STRIDE = 2**32  # a seed's weight versions: run tag + slot * VERSION_STRIDE + its optimizer step
RUN_TAG_SHIFT = 48  # engines kept across runs (a sweep's pool): no two runs' versions are the same number


def run_tag(run: str) -> int:
    """The high bits of every weight version of Ray Train run `run`."""
    return (zlib.crc32(run.encode()) & 0x7FFF) << RUN_TAG_SHIFT


@dataclass
class Shared:
    """What the clients of one rank's seeds share: the weight push to the engines, and which weight
    version the engines hold (each seed's versions its own: `VERSION_STRIDE`)."""

    push: object
    held: int = -1  # unknown until the first push (`Trial.begin`): a pool's engines hold another run's


class RolloutClient:
    """engines: the trial's data-parallel engine actors; this rank generates on engine rank mod their
    number, and rank 0 pushes the learner's weights to all of them. cfg: the trial's RolloutConfig.

    A configuration's seeds share the engines (`shared`, one per rank): a seed's weights are pushed
    before it generates whenever the engines hold another seed's (or an older) version."""

    def __init__(
        self,
        engines: list,
        cfg,
        learner,
        *,
        trial: str,
        rank: int,
        timeout_s: float,
        slot: int = 0,
        shared: Shared | None = None,
        run: str | None = None,
        pool=None,
    ):
        self.engines, self.cfg, self.learner = engines, cfg, learner
        self.trial, self.rank, self.timeout_s = trial, rank, timeout_s
        self.run = run or trial  # the Ray Train run whose engines these are (their placement group's name)
        self.pool = pool  # the sweep's pool that lent them (orchestrator/pool.py), or None
        self.tag = run_tag(self.run)
        self.service = engines[rank % len(engines)]
        self.shared = shared or Shared(weight_push(engines, cfg))  # rank 0 pushes; every rank prepares
        self.push = self.shared.push
        self.slot = slot
        self.weight_version = self.version(0)
        self.losses = 0  # rank 0: calls lost to a dead service, re-synced and retried

    def version(self, optimizer_step: int) -> int:
        """This seed's weight version at `optimizer_step` (its optimizer step when it is the only seed)."""
        return self.tag + self.slot * VERSION_STRIDE + optimizer_step

    def steps_behind(self, rollouts: RolloutBatch) -> int:
        """Optimizer steps between the weights that generated `rollouts` and the learner's now."""
        return self.version(self.learner.optimizer_step) - rollouts.weight_version

    def say(self, text: str) -> None:
        print(f"[trial {self.trial}] {text}", flush=True)

    def sync(self) -> None:
        """Push the learner's weights to every engine (`rollout.weight_transfer`), a bucket at a time: every
        rank makes each bucket (a gather under ZeRO-3), rank 0 sends it. An engine lost meanwhile gets
        them again once Ray has restarted it: every rank goes through the buckets again."""
        if self.cfg.colocate:  # the engine wakes on this GPU: the learner's cached blocks go back first
            torch.cuda.empty_cache()  # (the memory pre-flight's colocated sum counts only what is live)
        device = self.learner.device if WEIGHT_PUSHES[self.cfg.weight_transfer].on_gpu else "cpu"
        self.weight_version = self.version(self.learner.optimizer_step)
        deadline = time.monotonic() + SERVICE_RESTART_TIMEOUT_S
        while True:
            weights, lost = learner_weights(self.learner, self.push, device), None
            if self.rank == 0:
                try:
                    self.push(weights, self.weight_version)
                except (ray.exceptions.RayActorError, WeightGroupError) as e:  # dead or restarting
                    lost = e
            for _ in weights.buckets:  # the buckets a failed push left: every rank makes them all
                pass
            if not reduce_max(float(lost is not None)):
                break
            if self.rank == 0:
                self.stop_if_removed()
                self.losses += 1
                if time.monotonic() > deadline:
                    raise lost
                self.say(f"rollout service lost during a weight update ({lost}); pushing again")
                time.sleep(SERVICE_RETRY_PAUSE_S)  # a restarting actor refuses calls at once
        self.shared.held = self.weight_version
        barrier()  # no rank generates before the new weights are in

    def stop_if_removed(self) -> None:
        """A trial whose sweep stopped it (its engines' group removed, or the set its sweep's pool lent it
        released) ends here, saying nothing of a fault."""
        taken = not ray.get(self.pool.holds.remote(self.run)) if self.pool else engines_removed(self.cfg, self.run)
        if taken:
            raise TrialStopped(f"trial {self.trial}: its rollout engines were removed (the sweep stopped it)")

    def release_gpus(self) -> None:
        """Colocated engine: once every rank has its rollouts, it sleeps and frees the GPUs for the
        learner; the weight sync wakes it (`VLLMEngine.update_weights`)."""
        if not self.cfg.colocate:
            return
        barrier()
        if self.rank == 0:
            ray.get([engine.sleep.remote() for engine in self.engines])

    def sync_if_stale(self) -> None:
        """Push the learner's weights unless the engines already hold them (a collective, like `sync`)."""
        if self.shared.held != self.version(self.learner.optimizer_step):
            self.sync()

    def submit(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> Pending:
        """Start n rollouts of each prompt at the weights the engines hold; `collect` takes them."""
        return Pending(prompts, n, spec, self.service.generate.remote(prompts, n, spec, self.weight_version))

    def generate(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> RolloutBatch:
        """n rollouts of each prompt at the learner's weights; a lost service is re-synced and retried."""
        return self.collect(self.submit(prompts, n, spec))

    def collect(self, pending: Pending) -> RolloutBatch:
        """The rollouts of a submitted request (a collective); a lost service is re-synced and asked again,
        at the weights it was then given."""
        rollouts, error, ref = None, None, pending.ref
        for _ in range(SERVICE_RETRIES + 1):
            if rollouts is None:
                try:
                    if ref is None:
                        ref = self.submit(pending.prompts, pending.n, pending.spec).ref
                    rollouts = ray.get(ref, timeout=self.timeout_s)
                except (ray.exceptions.RayActorError, StaleWeightsError) as e:
                    error, ref = e, None
                except ray.exceptions.GetTimeoutError:  # a hung engine: restarted, then re-synced like a lost one
                    error, ref = calls.restart_hung(self.service, "the rollout engine", self.timeout_s), None
            if reduce_max(float(rollouts is None)) == 0:
                return rollouts
            self.stop_if_removed()
            if self.rank == 0:
                self.losses += 1
                cause = type(error).__name__ if error else "on another rank"
                self.say(
                    f"rollout service lost ({cause}); re-syncing weights version {self.weight_version} and retrying"
                )
            self.sync()
        raise RuntimeError(f"rollout service lost {SERVICE_RETRIES + 1} times in one call: {error}")


@dataclass
class Pending:
    """A generation request in flight: what it asked (to ask again after a loss) and its result's ref."""

    prompts: list[list[int]]
    n: int
    spec: SamplingSpec
    ref: ray.ObjectRef
