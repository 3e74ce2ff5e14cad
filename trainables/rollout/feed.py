"""A seed's rollouts, step by step: the step's problems and EAD's sampling at it, generated when the step
asks or ahead of it (`rollout.overlap`, and the next seed of a group while this one updates).

    step s:  problems(s) -> spec(s) -> take(s): the batch generated ahead for s (collected), or generated now
             overlap 1: the engines then start on s + 1's, at this policy
    group:   submit(s) starts s's generation while another seed updates; take(s) collects it

A batch generated ahead is exactly what the step would generate then: the same problems, spec and weights.
"""

from __future__ import annotations

import numpy as np

from trainables.data.arithmetic import Problem
from trainables.rollout.client import Pending, RolloutClient
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.step_metrics import timed
from trainables.tasks import encode_prompt


def step_prompts(num_train: int, step: int, per_step: int, rank: int, world: int, seed: int) -> list[int]:
    """This rank's prompt indices at an RL step: epoch-wise seeded permutations, read in order.

    A pure function of the step, so a resumed run continues at exactly the same data position.
    """
    per_rank = per_step // world
    start = step * per_step + rank * per_rank
    out = []
    for pos in range(start, start + per_rank):
        epoch, offset = divmod(pos, num_train)
        perm = np.random.default_rng([seed, epoch]).permutation(num_train)
        out.append(int(perm[offset]))
    return out


class SeedRollouts:
    """One seed's rollouts on one rank; `ahead` is the step and batch generated ahead (in flight or in)."""

    def __init__(
        self, cfg, client: RolloutClient, tokenizer, train_set: list[Problem], rank: int, world: int, grouped: bool
    ):
        self.cfg, self.client, self.tokenizer, self.train_set = cfg, client, tokenizer, train_set
        self.rank, self.world, self.grouped = rank, world, grouped
        self.ahead: tuple[int, Pending | RolloutBatch] | None = None

    def encode(self, problems: list[Problem]) -> list[list[int]]:
        return [encode_prompt(self.tokenizer, p, self.cfg.prompt) for p in problems]

    def problems(self, step: int) -> list[Problem]:
        cfg = self.cfg
        return [
            self.train_set[i]
            for i in step_prompts(
                len(self.train_set), step, cfg.learner.prompts_per_step, self.rank, self.world, cfg.seed
            )
        ]

    def spec(self, step: int) -> SamplingSpec:
        # EAD's s is the RL step, 1 at the first rollout (the official trainer's global_steps).
        return self.cfg.rollout.decoding.sampling(
            self.cfg.rollout.max_new_tokens, step + 1, seed=self.cfg.seed * 100_003 + step * 101 + self.rank
        )

    def take(self, step: int, problems: list[Problem], spec: SamplingSpec, t: dict[str, float]) -> RolloutBatch:
        """Step `step`'s rollouts: generated now, or the batch generated ahead; with rollout.overlap the
        engines then start on step + 1's at this policy (pushed first if they hold an older one)."""
        cfg = self.cfg
        if self.grouped and not (self.ahead is not None and self.ahead[0] == step):
            with timed(t, "sync"):  # the engines may hold another seed's weights: this seed's, pushed now
                self.client.sync_if_stale()
        with timed(t, "generate"):
            if self.ahead is not None and self.ahead[0] == step:
                self.settle()
                rollouts, self.ahead = self.ahead[1], None
            else:
                rollouts = self.client.generate(self.encode(problems), cfg.rollout.group_size, spec)
            self.client.release_gpus()
        if cfg.rollout.overlap and step + 1 < cfg.learner.steps:
            with timed(t, "sync"):
                self.client.sync_if_stale()
            self.submit(step + 1, sync=False)
        return rollouts

    def submit(self, step: int, sync: bool = True) -> None:
        """Start generating step `step`'s rollouts now, at this seed's weights (pushed first unless `sync` is
        False: just pushed), for this seed to collect when it takes the step: exactly what it would
        generate then."""
        if sync:
            self.client.sync_if_stale()
        self.ahead = (
            step,
            self.client.submit(self.encode(self.problems(step)), self.cfg.rollout.group_size, self.spec(step)),
        )

    def settle(self) -> None:
        """The batch in flight (rollout.overlap) collected, so the engines are free and it can be saved."""
        if self.ahead is not None and isinstance(self.ahead[1], Pending):
            self.ahead = (self.ahead[0], self.client.collect(self.ahead[1]))
