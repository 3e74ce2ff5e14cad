"""The trial's verifier actor: math-verify's rewards (`trainables.rewards.verify`) and validation
judgements (`trainables.evaluation`) on one process's main thread.

It sits above both modules it serves, so the reward module stays pure and evaluation builds on it
one way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from trainables.evaluation import judge, summarize
from trainables.rewards.verify import score_batch, time_limit


class VerifierService:
    """The trial's verifier, a long-lived Ray actor shared by its learner ranks.

    A sync actor runs its methods on its process's main thread, so math-verify keeps its timeouts;
    and one process per trial, where a Ray task per step would start a fresh worker each time once
    the idle ones are reclaimed (seconds per step on a busy 2-core machine).
    """

    def score(self, responses: Sequence[str], golds: Sequence[str]) -> tuple[list[float], dict[str, int]]:
        return score_batch(responses, golds)

    def judge(self, problems: Sequence[tuple[Sequence[str], str, bool]]) -> list[tuple[list[bool], list[str | None]]]:
        """Per problem (its samples' texts, gold answer, multiple choice): `trainables.evaluation.judge`."""
        return [judge(texts, gold, choice) for texts, gold, choice in problems]

    def summarize(
        self, correct: Sequence[Sequence[bool]], answers: Sequence[Sequence[str | None]], golds: Sequence[str]
    ) -> dict[str, float]:
        """`trainables.evaluation.summarize`, here because its majority vote compares answers with math-verify."""
        return summarize(correct, answers, golds)

    def health(self) -> dict:
        return {"pid": os.getpid(), "timeouts": time_limit() is not None}


def start_verifier():
    """A math-verify actor: stateless, so Ray restarts it and retries its calls if it dies."""
    import ray

    return (
        ray.remote(VerifierService)
        .options(num_cpus=0, max_restarts=-1, max_task_retries=-1, scheduling_strategy="DEFAULT")
        .remote()
    )
