"""The one piece of a sweep that runs inside Ray Train's controller: a run's reports relayed to its
configuration's Tune trial.

Ray Train runs a run's callbacks in its controller actor (one process per run) and imports their class
there by reference. Kept apart from `orchestrator.seeds`, whose imports reach torch, transformers,
math-verify and MLflow, so that each controller imports Ray alone (docs/performance.md).
"""

from __future__ import annotations

from ray.train.v2.api.callback import UserCallback


class SeedReport(UserCallback):
    """Hands each of a run's reports (rank 0's metrics) to its configuration's queue, with the run's index."""

    def __init__(self, inbox, index: int):
        self.inbox, self.index = inbox, index

    def after_report(self, run_context, metrics, checkpoint):
        self.inbox.put((self.index, dict(metrics[0])))
