"""The Ray Train worker loop: one RL step (docs/architecture.md) on every learner rank.

    prompts -> rollout service (EAD at the RL step) -> verifier -> old-logprob pass (T = 1, or the rollout's)
            -> [luffy / oger*: teacher members and OGER reward, trainables/algo/hybrid.py]
            -> group advantages -> TIS weights -> DeepSpeed update -> weights to the service

Its parts: the rollout client (trainables/rollout/client.py), the hybrid groups (hybrid.py), the learner
(learner.py), the metrics (step_metrics.py; every name documented in metrics.py), the validation
(validation.py), the checkpoints (resume.py), notices and stops (notices.py), the record (trial_log.py).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.train.torch import get_device

from trainables.algo.hybrid import HybridGroups, mix_teachers, teacher_response
from trainables.config import VAL_STEP, TrialConfig
from trainables.data.arithmetic import Problem
from trainables.data.benchmarks import BUILTIN
from trainables.data.offline import OfflineStore
from trainables.learner import Learner, align_columns, build_train_batch, last_token_entropy
from trainables.rollout.client import RolloutClient, Shared
from trainables.rollout.ead import ead_decay, tau_table
from trainables.rollout.feed import SeedRollouts
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.runtime import calls, resume
from trainables.runtime.checkpoint import rng_state, set_rng_state
from trainables.runtime.errors import TrialError
from trainables.runtime.ranks import reduce_max, reduce_sums
from trainables.runtime.trial_log import TrialLog, startup_breakdown
from trainables.step_metrics import check_finite, offline_metrics, rank_sums, step_metrics, timed, tis_max
from trainables.tasks import load_benchmarks, train_problems, within_context
from trainables.validation import Validation
from trainables.validation_cache import cached_base

IMPORTED_AT = time.time()  # this process's import of the trial's code ended: the start-up's `worker_imports`


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def trial_problems(cfg: TrialConfig, tokenizer, model_path: str, rank: int) -> tuple[list[Problem], dict[str, list]]:
    """(training problems, {benchmark: validation problems}); a file's problem whose prompt leaves no room
    for a response in the policy's context is skipped and counted ("overlong"), never sent to an engine."""
    from transformers import AutoConfig

    def say_skipped(what: str, counts: Counter) -> None:
        if +counts and rank == 0:
            print(f"[trial {cfg.name}] {what}: skipped {sum(counts.values())} rows {dict(+counts)}", flush=True)

    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    budget = positions - cfg.rollout.max_new_tokens if positions else float("inf")  # None: no limit it states
    train_set, val_sets = train_problems(cfg), {}
    if cfg.task.name == "offline_prompts":  # the built-in task's prompts are a few dozen tokens
        train_set, overlong = within_context(train_set, tokenizer, cfg.prompt, budget)
        say_skipped("training prompts", Counter(overlong=overlong))
        if not train_set:
            raise TrialError(
                f"trial {cfg.name}: every training prompt is longer than the policy's context "
                f"({positions} positions less rollout.max_new_tokens {cfg.rollout.max_new_tokens})"
            )
    sets, skipped = load_benchmarks(cfg.validation.benchmarks, cfg.task, cfg.task_seed, cfg.validation.num_prompts)
    for name, problems in sets.items():
        if name != BUILTIN:
            problems, overlong = within_context(problems, tokenizer, cfg.validation.prompt or cfg.prompt, budget)
            skipped[name] = skipped.get(name, Counter()) + Counter(overlong=overlong)
        say_skipped(f"validation {name}", skipped.get(name, Counter()))
        val_sets[name] = problems
    return train_set, val_sets


def schedule_metrics(cfg: TrialConfig, spec: SamplingSpec, lag: int) -> dict[str, float]:
    """The step's policy lag (optimizer steps between the rollouts' weights and the update's) and EAD's decay."""
    metrics = {"rollout/policy_lag": float(lag)}
    if cfg.rollout.decoding.schedule == "ead":
        metrics["rollout/ead_decay"] = ead_decay(spec.step, d0=cfg.rollout.decoding.ead.d0)
    return metrics


def hybrid_metrics(cfg: TrialConfig, mixed: dict[str, float]) -> dict[str, float]:
    """luffy / oger*: the hybrid groups' metrics over every rank (a collective); {} otherwise."""
    if not cfg.preset.uses_offline:
        return {}
    exploration_max = reduce_max(mixed.pop("oger_exploration_max"))
    return offline_metrics(reduce_sums(mixed), exploration_max, cfg.preset.needs_embeddings)


@dataclass(frozen=True)
class TrialInputs:
    """What a trial's workers receive from the driver: the config, validated once, and what is not config."""

    cfg: TrialConfig
    model_path: str  # the base policy's folder
    engines: list  # the rollout service's actors
    verifier: Any  # the verifier actor
    tracking_uri: str | None = None
    run_id: str | None = None  # the trial's MLflow run; None: untracked
    store: OfflineStore | None = None  # the offline store (luffy / oger*)
    embedder: Any = None  # the encoder actor (oger*)
    stop_file: str | None = None  # its existence asks the trial to checkpoint and stop (SIGTERM)
    started_at: float | None = None  # the driver's time.time() when the trial began starting up
    fit_at: float | None = None  # the driver's time.time() when it handed the trial to Ray Train
    run_name: str | None = None  # the Ray Train run the seed trains in (a configuration's: `TrialGroup`)
    trust_unsealed: bool = False  # resume from a checkpoint this product did not seal (--trust-unsealed)
    pool: Any = None  # the sweep's rollout pool that lent the engines (orchestrator/pool.py); None: the run's own


class Trial:
    """State of one rank's RL loop; `run()` drives it."""

    def __init__(self, inputs: TrialInputs, slot: int = 0, shared: Shared | None = None, grouped: bool = False):
        # The start-up stages' ends, from `started_at` (`startup_breakdown`), the first two the driver's.
        self.startup_marks = {"ray": inputs.fit_at, "worker_imports": IMPORTED_AT, "train_setup": time.time()}
        ctx = ray.train.get_context()
        cfg, model_path, engines, verifier = inputs.cfg, inputs.model_path, inputs.engines, inputs.verifier
        self.cfg, self.verifier, self.store, self.embedder = cfg, verifier, inputs.store, inputs.embedder
        self.slot, self.grouped = slot, grouped  # its place among the run's seeds (`TrialGroup`)
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.started_at = inputs.started_at
        # Ray sets no thread count for Train workers placed by Tune; default torch takes every core.
        torch.set_num_threads(max(1, int(cfg.learner.cpus_per_worker)))
        seed_everything(cfg.seed + self.rank)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id
        self.train_set, val_sets = trial_problems(cfg, self.tokenizer, model_path, self.rank)
        self.model_path = str(model_path)  # the base policy, recorded in checkpoints for their export
        # On GPUs, the device Ray Train gave this rank (it sets CUDA_VISIBLE_DEVICES and the local rank).
        device = str(get_device()) if cfg.learner.use_gpu else "cpu"
        self.startup_marks["data"] = time.time()
        self.learner = Learner(model_path, cfg, world_size=self.world, device=device)
        self.startup_marks["learner"] = time.time()
        self.client = RolloutClient(
            engines,
            cfg.rollout,
            self.learner,
            trial=cfg.name,
            rank=self.rank,
            timeout_s=cfg.checkpoint.actor_timeout_s,
            slot=slot,
            shared=shared,
            run=inputs.run_name,
            pool=inputs.pool,
        )
        self.feed = SeedRollouts(cfg, self.client, self.tokenizer, self.train_set, self.rank, self.world, grouped)
        self.validate = Validation(
            cfg, val_sets, self.client, verifier, self.tokenizer, rank=self.rank, world=self.world
        )
        self.record = TrialLog(
            cfg.name, cfg.learner.steps, inputs.tracking_uri, inputs.run_id, self.rank, cfg.logging.rollout_samples
        )
        self.start_step = 0
        self.base_val: dict[str, float] = {}
        self.val_history: list[tuple[int, dict[str, float]]] = []  # (RL steps done, val/*)
        self.last_step_rows = None  # (problems, rollouts, rewards, offpolicy) of the latest step
        self.last_finite: dict[str, float] = {}
        self.then = None  # called once a step's rollouts are in (`TrialGroup`: the next seed's generation)
        self.rng = rng_state()  # this seed's RNG streams once built (`own_rng`)

    @property
    def latest_val(self) -> dict[str, float]:
        """val/* of the latest validation ({} before the first)."""
        return self.val_history[-1][1] if self.val_history else {}

    # -- stages ---------------------------------------------------------------------------------
    def score_texts(self, texts: list[str], golds: list[str]) -> tuple[torch.Tensor, dict[str, int]]:
        """Verifiable rewards [B] and reason counts of responses, from the trial's verifier actor; it
        judges each whole assistant turn (the prompt's prefill, then the response)."""
        turns = [self.cfg.prompt.completion(text) for text in texts]
        rewards, reasons = self.call(self.verifier, self.verifier.score.remote(turns, golds), "the verifier")
        return torch.tensor(rewards, dtype=torch.float32), reasons

    def call(self, actor, ref, what: str):
        return calls.get(actor, ref, self.cfg.checkpoint.actor_timeout_s, what)

    def score(self, rollouts: RolloutBatch, problems: list[Problem]) -> tuple[torch.Tensor, dict[str, int]]:
        """Rewards [P * n] of the rollouts against their problems' gold answers."""
        golds = [problems[i // rollouts.n].answer for i in range(len(rollouts.texts))]
        return self.score_texts(rollouts.texts, golds)

    def rollout_step(self, step: int) -> dict[str, float]:
        cfg, t = self.cfg, {}
        with timed(t, "step"):
            problems, spec = self.feed.problems(step), self.feed.spec(step)
            rollouts = online = self.feed.take(step, problems, spec, t)
            if self.then is not None:  # the engines are free: the next seed's generation starts (`TrialGroup`)
                self.then()
            lag = self.client.steps_behind(rollouts)  # optimizer steps behind the update
            # The encoder actor embeds the online texts while this rank scores and runs its T = 1 pass: whole
            # assistant turns (prefill + response), as the teachers' texts it compares them with.
            embeddings = (
                self.embedder.embed.remote(
                    [cfg.prompt.completion(text) for text in rollouts.texts], [p.question for p in problems]
                )
                if self.embedder is not None
                else None
            )
            with timed(t, "score"):
                rewards, reasons = self.score(rollouts, problems)
            taus = self.logprob_taus(spec)
            batch = build_train_batch(rollouts, self.pad_id, taus)
            if cfg.preset.uses_offline or not self.learner.fuses_old_pass:
                with timed(t, "old_logprob"):
                    logp_old, entropy = self.learner.old_logprobs(batch)  # entropy: the OGER H source
            else:  # one optimizer step, no teachers: the update's own pass gives the old log-probs
                logp_old, t["old_logprob"] = None, 0.0
            offpolicy, mixed = torch.zeros(batch.size, dtype=torch.bool), {}
            if cfg.preset.uses_offline:
                with timed(t, "offline"):
                    hybrid = self.mix_offline(step, rollouts, problems, rewards, entropy, batch, embeddings)
                rollouts, rewards, offpolicy, mixed = hybrid.rollouts, hybrid.rewards, hybrid.offpolicy, hybrid.metrics
                batch = build_train_batch(rollouts, self.pad_id, taus)
                # Online rows keep their columns; teacher rows get 0 = behaviour 0, so a TIS weight of 1.
                logp_old = align_columns(logp_old, batch.response_mask.shape[1]) * (~offpolicy)[:, None]
            grouped = rewards.view(len(problems), cfg.rollout.group_size)  # [P, N], hybrid for luffy/oger
            with timed(t, "update"):
                update = self.learner.rl_update(batch, grouped, logp_old, offpolicy)
            if cfg.preset.uses_offline:  # the teacher members' advantage: eq. 8-9 can make it strongly negative
                mixed["advantage_sum"] = float(update.advantages[offpolicy].sum())
            if not cfg.rollout.overlap and not self.grouped:  # grouped: pushed when this seed generates next
                with timed(t, "sync"):
                    self.client.sync()
        self.last_step_rows = (problems, rollouts, rewards, offpolicy)
        mask = batch.response_mask
        sums = rank_sums(online, mask, rewards, grouped, reasons, update.tis, update.stats, cfg.rollout.tis_cap)
        metrics = step_metrics(
            reduce_sums(sums),
            reduce_max(tis_max(update.tis, mask)),
            update.stats,
            t,
            step=step,
            optimizer_step=self.learner.optimizer_step,
            service_losses=self.client.losses,
        )
        return metrics | schedule_metrics(cfg, spec, lag) | hybrid_metrics(cfg, mixed)

    def logprob_taus(self, spec: SamplingSpec) -> tuple[float, ...] | None:
        """The learner's temperature at each response position: the rollout schedule's (`rollout`), or
        None (T = 1; also a rollout at T = 1 everywhere, so that case stays bit for bit untempered)."""
        if self.cfg.logprob_temperature != "rollout":
            return None
        taus = tau_table(spec.schedule, spec.params, spec.step, spec.max_new_tokens)
        return None if all(tau == 1.0 for tau in taus) else taus

    def mix_offline(self, step, rollouts, problems, rewards, entropy, batch, embeddings) -> HybridGroups:
        """Teacher trajectories into the groups (luffy / oger*), OGER's reward on the online ones.

        embeddings: the encoder actor's pending result for these rollouts (oger*), else None.
        """
        cfg = self.cfg
        finished = torch.tensor([r == "stop" for r in rollouts.finish_reasons])
        last_entropy = last_token_entropy(entropy, batch.response_mask, finished, cfg.algorithm.last_token)
        embedded, encoder_seconds = None, 0.0
        if embeddings is not None:
            online_emb, offline_emb, encoder_seconds = self.call(self.embedder, embeddings, "the encoder")
            embedded = (online_emb, offline_emb)
        hybrid = mix_teachers(
            rollouts,
            [p.question for p in problems],
            [p.answer for p in problems],
            rewards,
            last_entropy,
            embedded,
            preset=cfg.preset,
            k=cfg.algorithm.replacement_density,
            store=self.store,
            score=lambda texts, answers: self.score_texts(texts, answers)[0],
            to_response=lambda text: teacher_response(
                text, self.tokenizer, cfg.rollout.max_new_tokens, cfg.prompt.prefill
            ),
            rng=np.random.default_rng([cfg.seed, step, self.rank, 0x0E6E]),  # a function of the step: resumable
        )
        hybrid.metrics["encoder_seconds"] = encoder_seconds
        return hybrid

    # -- checkpoints -----------------------------------------------------------------------------
    @property
    def part(self) -> str:
        """This seed's folder inside its group's checkpoints ("" when it trains alone: the layout of one)."""
        return f"seed_{self.slot}" if self.grouped else ""

    def checkpoint_part(self, reported: dict[str, float]) -> resume.Part:
        """What this seed adds to a checkpoint: its learner, rank 0's record, this rank's RNG streams and its
        next batch when generated ahead."""
        state = {
            "base_val": self.base_val,
            "val_history": self.val_history,
            "metrics": reported,
            "model_path": self.model_path,
            "trial": self.cfg.model_dump(mode="json"),
        }
        self.feed.settle()  # the next step's batch, generated ahead from the weights before this step's update
        ahead = {"next_rollouts": asdict(self.feed.ahead[1])} if self.feed.ahead is not None else {}
        return resume.Part(self.part, self.learner, state, {"rng": self.rng, **ahead})

    def load_state(self, state: dict) -> None:
        """This seed's part of the checkpoint a resume continues from (`resume.restore`)."""
        self.start_step = state["step"] + 1
        self.base_val = state["base_val"]
        self.val_history = [(int(done), val) for done, val in state["val_history"]]
        self.rng = state["rng"]
        if state["next_rollouts"] is not None:
            self.feed.ahead = (self.start_step, RolloutBatch(**state["next_rollouts"]))

    @contextmanager
    def own_rng(self):
        """This seed's python / numpy / torch RNG streams, swapped in while it works and kept after."""
        set_rng_state(self.rng)
        try:
            yield
        finally:
            self.rng = rng_state()

    # -- a step ----------------------------------------------------------------------------------
    def begin(self) -> None:
        """After a restore: the engines get this seed's weights, its record resumes, and a fresh seed
        validates its base policy (MLflow step 0)."""
        cfg = self.cfg
        self.client.sync()  # the service must serve the learner's weights, also after a resume
        self.record.resume(self.start_step)
        # Start-up (Ray, engines, worker group, DeepSpeed, restore) ends here; the cumulative loop wall
        # and logging time let `python -m bench` split a steady state into compute and overhead.
        self.loop_start = time.perf_counter()
        self.startup_marks["restore_and_sync"] = time.time()
        self.startup = startup_breakdown(self.started_at, self.startup_marks)
        if cfg.validation.every and self.start_step == 0:
            with timed(t := {}, "validate"):  # the base policy, before any update
                base, reused = cached_base(self.validate, cfg, self.model_path, rank=self.rank, world=self.world)
            self.val_history.append((0, base))
            if reused:
                self.record.say("validation of the base policy: reused from an identical earlier trial (cached)")
            self.base_val = {f"{k}_base": v for k, v in self.latest_val.items()}  # in every report to Tune
            # MLflow step 0: every val/* curve starts at the base policy; its `_base` copy once, as a summary
            self.record.log(-1, {**self.latest_val, **self.base_val, "timing/validate": t["validate"]})

    def advance(self, step: int) -> tuple[dict[str, float], bool]:
        """RL step `step` and its validation when one is due, logged: (its metrics, whether it validated)."""
        cfg, every = self.cfg, self.cfg.validation.every
        metrics = self.rollout_step(step)
        self.last_finite = check_finite(metrics, self.last_finite, f"trial {cfg.name}: step {step + 1}")
        last = step == cfg.learner.steps - 1
        validated = bool(every) and ((step + 1) % every == 0 or last)
        if validated:
            self.feed.settle()  # the engines take this policy's weights once the batch in flight is in
            self.client.sync_if_stale()
            with timed(t := {}, "validate"):
                self.val_history.append((step + 1, self.validate(step + 1)))
            metrics.update(self.latest_val, **{"timing/validate": t["validate"]})
            self.record.artifacts(step, self.val_history, self.last_step_rows)
        metrics.update(
            {
                "timing/loop_wall": time.perf_counter() - self.loop_start,
                **self.record.seconds,
                **(self.startup if step == self.start_step else {}),
            }
        )
        self.record.log(step, metrics)
        metrics.update(self.base_val)
        if cfg.logging.progress_every and ((step + 1) % cfg.logging.progress_every == 0 or last):
            self.record.progress(step, metrics)
        return metrics, validated

    def reported(self, metrics: dict[str, float], stop: bool) -> dict[str, float]:
        """The step's report to Ray Train: every report carries the latest validation, so Tune's schedulers
        always see the objective, and which step it is of (a searcher keys its value by it)."""
        reported = {**self.latest_val, **metrics, "progress/preempted": float(stop)}
        if self.val_history:
            reported[VAL_STEP] = self.val_history[-1][0]
        return reported
