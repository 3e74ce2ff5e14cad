"""Validation during training, judged and summarized as `orchestrator.evaluate` does: each rank samples
its slice of every benchmark (`validation.samples_of` it), the verifier judges each whole assistant turn,
rank 0 summarizes all problems and every rank gets the result.

Metrics: val/<benchmark>/<metric> (`ValidationConfig.metric_names`), val/macro/* over several
benchmarks (the metrics they share), val/accuracy (each benchmark's avg@k, macro-averaged: the default
objective), val/accuracy_se (its standard error) and val/response_length.
"""

from __future__ import annotations

import math

import numpy as np

from trainables.config import TrialConfig
from trainables.evaluation import avg_at_k_se, macro_row, metric_key
from trainables.rollout.client import RolloutClient
from trainables.runtime import calls
from trainables.runtime.ranks import from_rank0, gather
from trainables.tasks import encode_prompt

VALIDATION_SEQUENCES_PER_CALL = 64  # bounds one validation call's engine batch (prompts x samples)


class Validation:
    """val_sets: {benchmark: problems}; verifier: the trial's verifier actor."""

    def __init__(
        self, cfg: TrialConfig, val_sets: dict, client: RolloutClient, verifier, tokenizer, *, rank: int, world: int
    ):
        self.cfg, self.val_sets, self.client, self.verifier, self.tokenizer = cfg, val_sets, client, verifier, tokenizer
        self.rank, self.world = rank, world

    def ask(self, method: str, *args):
        """The verifier actor's `method`, within `checkpoint.actor_timeout_s`."""
        ref = getattr(self.verifier, method).remote(*args)
        return calls.get(self.verifier, ref, self.cfg.checkpoint.actor_timeout_s, "the verifier")

    def __call__(self, steps_done: int) -> dict[str, float]:
        """val/* of the policy after `steps_done` RL steps (EAD's s), on every rank."""
        v = self.cfg.validation
        prompt = v.prompt or self.cfg.prompt
        mine, texts, tokens, call = [], [], [], 0
        for name, problems in self.val_sets.items():
            k, shard = v.samples_of(name), problems[self.rank :: self.world]
            mine += [(name, problem) for problem in shard]
            per_call = max(1, VALIDATION_SEQUENCES_PER_CALL // k)
            # Every rank makes the same number of calls (generate is a collective round), sized by the largest share.
            for start in range(0, -(-len(problems) // self.world), per_call):
                seed = (self.cfg.seed * 7919 + 17 + self.rank) * 1009 + call  # the same at every validation
                spec = v.decoding.sampling(self.cfg.rollout.max_new_tokens, steps_done, seed=seed)
                prompts = [encode_prompt(self.tokenizer, p, prompt) for p in shard[start : start + per_call]]
                rollouts = self.client.generate(prompts, k, spec)
                texts += [prompt.completion(text) for text in rollouts.texts]
                tokens += [len(r) for r in rollouts.response_ids]
                call += 1
        ends = np.cumsum([0] + [v.samples_of(name) for name, _ in mine])  # problem i's samples: ends[i]:ends[i+1]
        problems = [(texts[ends[i] : ends[i + 1]], p.answer, bool(p.choices)) for i, (_, p) in enumerate(mine)]
        verdicts = self.ask("judge", problems)
        rows = [
            (name, p.uid, p.answer, correct, answers, sum(tokens[ends[i] : ends[i + 1]]))
            for i, ((name, p), (correct, answers)) in enumerate(zip(mine, verdicts))
        ]
        rows = gather(rows, self.world)
        return from_rank0(self.summarize(rows) if self.rank == 0 else None)

    def summarize(self, rows: list[tuple]) -> dict[str, float]:
        """val/* from every problem's (benchmark, uid, gold, correct, answers, tokens)."""
        rows_by_name = {}
        for row in sorted(rows, key=lambda r: r[1]):  # problem order does not depend on the ranks
            rows_by_name.setdefault(row[0], []).append(row)
        summaries, accuracy, se = {}, {}, {}
        for name, group in rows_by_name.items():
            _, _, golds, correct, answers, tokens = zip(*group)
            k = self.cfg.validation.samples_of(name)
            summaries[name] = {
                **self.ask("summarize", correct, answers, golds),
                "response_length": sum(tokens) / (k * len(group)),
            }
            accuracy[name] = summaries[name][f"avg@{k}"]
            se[name] = avg_at_k_se([c[:k] for c in correct])
        if len(summaries) > 1:
            summaries["macro"] = macro_row(summaries)
        metrics = {
            f"val/{name}/{metric_key(key)}": value
            for name, summary in summaries.items()
            for key, value in summary.items()
        }
        every = [s for name, s in summaries.items() if name != "macro"]
        metrics["val/accuracy"] = sum(accuracy.values()) / len(accuracy)
        # Its standard error, the benchmarks independent: the measurement noise in the objective.
        metrics["val/accuracy_se"] = math.sqrt(sum(e * e for e in se.values())) / len(se)
        metrics["val/response_length"] = sum(s["response_length"] for s in every) / len(every)
        return metrics
