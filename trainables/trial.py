"""The Ray Train worker loop: one RL step as in DESIGN.md, on every learner rank.

    prompts -> rollout service (EAD at the RL step) -> verifier -> old-logprob pass (T = 1, or the rollout's)
            -> [luffy / oger*: teacher members and OGER reward, trainables/hybrid.py]
            -> group advantages -> TIS weights -> DeepSpeed update -> weights to the service

Metric names (per RL step; sums are reduced over ranks before averaging):
    rollout/reward_mean, rollout/accuracy, rollout/response_length, rollout/stop_fraction,
    rollout/frac_zero_std, rollout/verify_<reason> (counts), rollout/ead_decay (d_s, EAD only),
    policy/entropy, policy/clip_fraction, policy/kl, policy/grad_norm, policy/lr, learner/pad_fraction
    (padding in the update's micro-batches), tis/weight_mean, tis/weight_max, tis/capped_fraction,
    timing/{generate,score,old_logprob,offline,update,sync,validate,step,report,checkpoint},
    timing/tokens_per_s, timing/startup and timing/startup_{workers,data,learner,restore_and_sync} (at
    the first step), timing/{loop_wall,logging} (cumulative seconds),
    policy/offpolicy_token_share, faults/service_losses (cumulative, rank 0), and at a resume
    faults/{resumed_from_step,redone_steps}; with luffy / oger*: offline/{replaced,accuracy,groups_without_data,
    advantage_mean},
    rollout/accuracy_online_kept; with oger*: oger/{divergence_mean,last_token_entropy_mean,
    exploration_mean,exploration_max}, timing/encoder (the encoder actor's busy seconds, every rank's texts).
    Every `validation.every` steps: val/<benchmark>/{avg_at_k,pass_at_1,...,maj_at_k,worst_at_k,
    response_length} (ValidationConfig.metric_names), val/accuracy (avg@k over the benchmarks),
    val/response_length. progress/{step,optimizer_step}.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.fs
import ray
import torch
import torch.distributed as dist
from ray.train.torch import get_device

from trainables import calls
from trainables.advantages import group_advantages, zero_std_fraction
from trainables.artifacts import rollout_samples_jsonl, validation_curve
from trainables.checkpoint import (TRIAL_STATE, checkpoint_problem, rank_file, read_rank_state, rng_state,
                                   saved_world_size, set_rng_state, write_manifest)
from trainables.config import VAL_STEP, DecodingConfig, PromptConfig, TrialConfig
from trainables.data.arithmetic import Problem
from trainables.data.tasks import encode_prompt, load_benchmarks, train_problems
from trainables.data.offline import OfflineStore
from trainables.errors import CheckpointError, NonFiniteError, write_failure
from trainables.evaluation import avg_at_k_se, macro_row, metric_key
from trainables.hybrid import HybridGroups, build_hybrid
from trainables.learner import Learner, TrainBatch, align_columns, build_train_batch, last_token_entropy
from trainables.losses import tis_weights
from trainables.notices import TRAINING, Notices, WorkerTerminating, arm_sigterm_notice
from trainables.rewards.verify import REASONS
from trainables.rollout.ead import ead_decay, tau_table
from trainables.rollout.push import weight_push
from trainables.rollout.service import StaleWeightsError, engines_removed
from trainables.rollout.types import RolloutBatch, SamplingSpec
from trainables.rollout.weight_sync import WeightGroupError
from trainables.step_log import StepLogger

SERVICE_RETRIES = 3  # rollout-service losses survived within one call before the step fails
SERVICE_RESTART_TIMEOUT_S = 300
SERVICE_RETRY_PAUSE_S = 2.0  # a restarting actor refuses calls at once (ActorUnavailableError): wait, then push
VALIDATION_SEQUENCES_PER_CALL = 64  # bounds one validation call's engine batch (prompts x samples)
WATCHED = ("policy/grad_norm", "policy/entropy", "policy/kl", "rollout/reward_mean")  # finite at every step
LOGGED_KEYS = ("progress/step", "timing/validate")  # per-step metrics; and step 0's base validation


def check_finite(metrics: dict[str, float], last_finite: dict[str, float], where: str) -> dict[str, float]:
    """The step's watched metrics, rounded, if all are finite (the next step's `last_finite`); else a
    NonFiniteError naming the step, what broke and the last finite step's values."""
    if bad := sorted(k for k in WATCHED if not math.isfinite(metrics[k])):
        raise NonFiniteError(f"{where}: {', '.join(bad)} not finite; the last finite step's: "
                             f"{last_finite or 'none (the first step)'}; lower learner.lr or check the data")
    return {k: round(metrics[k], 6) for k in ("progress/step", *WATCHED)}


class TrialStopped(RuntimeError):
    """The trial was stopped from outside (its rollout engines removed): not a fault to retry."""


@contextmanager
def timed(timings: dict[str, float], key: str):
    start = time.perf_counter()
    yield
    timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sum each value over ranks (keys must be equal on every rank)."""
    if not dist.is_initialized():
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def reduce_max(value: float) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sampling_spec(decoding: DecodingConfig, max_new_tokens: int, step: int, seed: int) -> SamplingSpec:
    return SamplingSpec(schedule=decoding.schedule, params=decoding.schedule_params(),
                        max_new_tokens=max_new_tokens, top_p=decoding.top_p, step=step, seed=seed)


class Trial:
    """State of one rank's RL loop; `run()` drives it."""

    def __init__(self, cfg: TrialConfig, model_path: str, engines: list, verifier, tracking: dict, *,
                 store: OfflineStore | None = None, embedder=None, stop_file: str | None = None,
                 started_at: float | None = None):
        self.startup_marks = {"workers": time.time()}  # start-up stages' ends, from `started_at`
        ctx = ray.train.get_context()
        self.cfg, self.verifier, self.store, self.embedder = cfg, verifier, store, embedder
        # The stop file's existence asks the trial to checkpoint and stop (SIGTERM); resolved once.
        self.stop_file = pyarrow.fs.FileSystem.from_uri(stop_file) if stop_file else None
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.started_at = started_at  # the driver's time.time() when the trial began starting up
        self.engines = engines  # data-parallel rollout actors; this rank generates on one of them
        self.service = engines[self.rank % len(engines)]
        self.push_weights = weight_push(engines, cfg.rollout)  # rank 0 pushes; every rank prepares
        # Ray sets no thread count for Train workers placed by Tune; default torch takes every core.
        torch.set_num_threads(max(1, int(cfg.learner.cpus_per_worker)))
        seed_everything(cfg.seed + self.rank)
        self.train_set = train_problems(cfg)
        self.val_sets, skipped = load_benchmarks(cfg.validation.benchmarks, cfg.task, cfg.task_seed,
                                                 cfg.validation.num_prompts)
        for name, counts in skipped.items():
            if counts and self.rank == 0:
                print(f"[trial {cfg.name}] validation {name}: skipped {sum(counts.values())} rows {dict(counts)}")
        self.model_path = str(model_path)  # the base policy, recorded in checkpoints for their export
        # On GPUs, the device Ray Train gave this rank (it sets CUDA_VISIBLE_DEVICES and the local rank).
        device = str(get_device()) if cfg.learner.use_gpu else "cpu"
        self.startup_marks["data"] = time.time()
        self.learner = Learner(model_path, cfg, world_size=self.world, device=device)
        self.startup_marks["learner"] = time.time()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id
        self.logger = StepLogger(tracking.get("uri"), tracking.get("run_id")) if self.rank == 0 else None
        self.start_step = 0
        self.weight_version = 0
        self.base_val: dict[str, float] = {}
        self.val_history: list[tuple[int, dict[str, float]]] = []  # (RL steps done, val/*)
        self.last_step_rows = None  # (problems, rollouts, rewards, offpolicy) of the latest step
        self.save_seconds: float | None = None  # the latest checkpoint's cost, for the deadline
        self.last_step_seconds: float | None = None
        self.service_losses = 0  # rank 0: rollout-service calls lost to a dead service, re-synced and retried
        self.notices = Notices(self.rank, engines)  # drains and SIGTERM: checkpoint before the resources go

    @property
    def latest_val(self) -> dict[str, float]:
        """val/* of the latest validation ({} before the first)."""
        return self.val_history[-1][1] if self.val_history else {}

    # -- stages ---------------------------------------------------------------------------------
    def encode(self, problems: list[Problem], prompt: PromptConfig | None = None) -> list[list[int]]:
        return [encode_prompt(self.tokenizer, p, prompt or self.cfg.prompt) for p in problems]

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

    def sync_weights(self) -> None:
        """Push the learner's weights to every rollout engine (`rollout.weight_transfer`); an engine that
        is lost meanwhile gets them again once Ray has restarted it."""
        on_gpu = self.cfg.rollout.weight_transfer in ("nccl", "ipc")  # sent from the learner's GPU
        state = self.learner.full_state_dict(keep_device=on_gpu)  # collective under ZeRO-3
        state = self.push_weights.prepare(state)  # collective for ipc
        self.weight_version = self.learner.optimizer_step
        if self.rank == 0:
            deadline = time.monotonic() + SERVICE_RESTART_TIMEOUT_S
            while True:
                try:
                    self.push_weights(state, self.weight_version)
                    break
                except (ray.exceptions.RayActorError, WeightGroupError) as e:  # dead or restarting
                    self.stop_if_engines_removed()
                    self.service_losses += 1
                    if time.monotonic() > deadline:
                        raise
                    print(f"[trial {self.cfg.name}] rollout service lost during a weight update ({e}); "
                          f"pushing again", flush=True)
                    time.sleep(SERVICE_RETRY_PAUSE_S)  # a restarting actor refuses calls at once
        if dist.is_initialized():
            dist.barrier()  # no rank generates before the new weights are in

    def stop_if_engines_removed(self) -> None:
        """A trial whose sweep stopped it (its engines' group removed) ends here, saying nothing of a fault."""
        if engines_removed(self.cfg.rollout, self.cfg.name):
            raise TrialStopped(f"trial {self.cfg.name}: its rollout engines were removed (the sweep stopped it)")

    def release_gpus(self) -> None:
        """Colocated engine: once every rank has its rollouts, it sleeps and frees the GPUs for the
        learner; the weight sync wakes it (`VLLMEngine.update_weights`)."""
        if not self.cfg.rollout.colocate:
            return
        if dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            ray.get([engine.sleep.remote() for engine in self.engines])

    def generate(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> RolloutBatch:
        """Rollouts from the service at the learner's weights; a lost service is re-synced and retried.

        Ray restarts a dead service with its initial weights; every rank learns of a loss through an
        all-reduce, all re-sync together, and only the ranks without rollouts ask again.
        """
        rollouts, error = None, None
        for _ in range(SERVICE_RETRIES + 1):
            if rollouts is None:
                timeout_s = self.cfg.checkpoint.actor_timeout_s
                try:
                    rollouts = ray.get(self.service.generate.remote(prompts, n, spec, self.weight_version),
                                       timeout=timeout_s)
                except (ray.exceptions.RayActorError, StaleWeightsError) as e:
                    error = e
                except ray.exceptions.GetTimeoutError:  # a hung engine: restarted, then re-synced like a lost one
                    error = calls.restart_hung(self.service, "the rollout engine", timeout_s)
            if reduce_max(float(rollouts is None)) == 0:
                return rollouts
            self.stop_if_engines_removed()
            if self.rank == 0:
                self.service_losses += 1
                cause = type(error).__name__ if error else "on another rank"
                print(f"[trial {self.cfg.name}] rollout service lost ({cause}); re-syncing weights version "
                      f"{self.weight_version} and retrying", flush=True)
            self.sync_weights()
        raise RuntimeError(f"rollout service lost {SERVICE_RETRIES + 1} times in one call: {error}")

    def rollout_step(self, step: int) -> dict[str, float]:
        cfg, t = self.cfg, {}
        with timed(t, "step"):
            problems = [self.train_set[i] for i in step_prompts(
                len(self.train_set), step, cfg.learner.prompts_per_step, self.rank, self.world, cfg.seed)]
            # EAD's s is the RL step, 1 at the first rollout (the official trainer's global_steps).
            spec = sampling_spec(cfg.rollout.decoding, cfg.rollout.max_new_tokens, step + 1,
                                 seed=cfg.seed * 100_003 + step * 101 + self.rank)
            with timed(t, "generate"):
                rollouts = self.generate(self.encode(problems), cfg.rollout.group_size, spec)
                self.release_gpus()
            online = rollouts
            # The encoder actor embeds the online texts while this rank scores and runs its T = 1 pass: whole
            # assistant turns (prefill + response), as the teachers' texts it compares them with.
            embeddings = (self.embedder.embed.remote([cfg.prompt.completion(text) for text in rollouts.texts],
                                                     [p.question for p in problems])
                          if self.embedder is not None else None)
            with timed(t, "score"):
                rewards, reasons = self.score(rollouts, problems)
            taus = self.logprob_taus(spec)
            batch = build_train_batch(rollouts, self.pad_id, taus)
            with timed(t, "old_logprob"):
                logp_old, entropy = self.learner.old_logprobs(batch)  # entropy: the OGER H source
            offpolicy, mixed = torch.zeros(batch.size, dtype=torch.bool), {}
            if cfg.preset.uses_offline:
                with timed(t, "offline"):
                    hybrid = self.mix_offline(step, rollouts, problems, rewards, entropy, batch, embeddings)
                rollouts, rewards, offpolicy, mixed = hybrid.rollouts, hybrid.rewards, hybrid.offpolicy, hybrid.metrics
                batch = build_train_batch(rollouts, self.pad_id, taus)
                # Online rows keep their columns; teacher rows get 0 = behaviour 0, so a TIS weight of 1.
                logp_old = align_columns(logp_old, batch.response_mask.shape[1]) * (~offpolicy)[:, None]
            grouped = rewards.view(len(problems), cfg.rollout.group_size)  # [P, N], hybrid for luffy/oger
            advantages = group_advantages(grouped, use_std=cfg.algorithm.use_std).flatten()  # [P * N]
            if cfg.preset.uses_offline:  # the teacher members' advantage: eq. 8-9 can make it strongly negative
                mixed["advantage_sum"] = float(advantages[offpolicy].sum())
            tis = tis_weights(logp_old, batch.behaviour_logp, cfg.rollout.tis_cap, mask=batch.response_mask,
                              level=cfg.rollout.tis_level)  # [B, T]
            with timed(t, "update"):
                stats = self.learner.update(batch, advantages, logp_old, tis, offpolicy)
            with timed(t, "sync"):
                self.sync_weights()
        self.last_step_rows = (problems, rollouts, rewards, offpolicy)
        metrics = self.step_metrics(step, online, batch, rewards, grouped, reasons, tis, stats, t)
        if cfg.rollout.decoding.schedule == "ead":
            metrics["rollout/ead_decay"] = ead_decay(spec.step, d0=cfg.rollout.decoding.ead.d0)
        return metrics | self.offline_metrics(mixed)

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
        embed, encoder_seconds = None, 0.0
        if embeddings is not None:
            online_emb, offline_emb, encoder_seconds = self.call(self.embedder, embeddings, "the encoder")
            embed = lambda texts, keys: (online_emb, offline_emb)  # noqa: E731
        golds = [p.answer for p in problems]

        hybrid = build_hybrid(
            rollouts, [p.question for p in problems], golds, rewards, last_entropy, preset=cfg.preset,
            k=cfg.algorithm.replacement_density, store=self.store, embed=embed,
            score=lambda texts, answers: self.score_texts(texts, answers)[0],
            tokenizer=self.tokenizer, max_tokens=cfg.rollout.max_new_tokens, prefill=cfg.prompt.prefill,
            rng=np.random.default_rng([cfg.seed, step, self.rank, 0x0E6E]),  # a function of the step: resumable
        )
        hybrid.metrics["encoder_seconds"] = encoder_seconds
        return hybrid

    def offline_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """oger/* and offline/* of the step (reduced over ranks); nothing for grpo."""
        if not self.cfg.preset.uses_offline:
            return {}
        exploration_max = reduce_max(sums.pop("oger_exploration_max"))
        s = reduce_sums(sums)
        out = {
            "offline/replaced": s["replaced"],
            "offline/accuracy": s["offline_correct"] / max(s["replaced"], 1.0),
            "offline/groups_without_data": s["no_offline_groups"],
            "offline/advantage_mean": s["advantage_sum"] / max(s["replaced"], 1.0),
            "rollout/accuracy_online_kept": s["online_correct"] / max(s["online"], 1.0),
        }
        if self.cfg.preset.needs_embeddings:
            scored = max(s["oger_scored"], 1.0)
            out |= {"timing/encoder": s["encoder_seconds"],  # the encoder actor's busy time, every rank's texts
                    "oger/divergence_mean": s["oger_divergence"] / scored,
                    "oger/last_token_entropy_mean": s["oger_entropy"] / scored,
                    "oger/exploration_mean": s["oger_exploration"] / scored,
                    "oger/exploration_max": exploration_max}
        return out

    def step_metrics(self, step, rollouts, batch: TrainBatch, rewards, grouped, reasons, tis, stats, t):
        mask = batch.response_mask
        capped = (tis >= self.cfg.rollout.tis_cap) if self.cfg.rollout.tis_cap else torch.zeros_like(mask)
        sums = {
            "seqs": float(len(rollouts.texts)),
            "groups": float(grouped.shape[0]),
            "reward": float(rewards.sum()),
            "length": float(rollouts.num_tokens),
            "stop": float(sum(r == "stop" for r in rollouts.finish_reasons)),
            "zero_std": float(zero_std_fraction(grouped)) * grouped.shape[0],
            "tis_sum": float((tis * mask).sum()),
            "tis_capped": float((capped & mask).sum()),
            **{f"verify_{k}": float(reasons.get(k, 0)) for k in REASONS},
            **{k: v for k, v in stats.items() if k.endswith("_sum") or k == "tokens"},
        }
        s = reduce_sums(sums)
        tokens = max(s["tokens"], 1.0)
        metrics = {
            "rollout/reward_mean": s["reward"] / s["seqs"],
            "rollout/accuracy": s["verify_correct"] / s["seqs"],
            "rollout/response_length": s["length"] / s["seqs"],
            "rollout/stop_fraction": s["stop"] / s["seqs"],
            "rollout/frac_zero_std": s["zero_std"] / s["groups"],
            **{f"rollout/verify_{k}": s[f"verify_{k}"] for k in REASONS},
            "policy/entropy": s["entropy_sum"] / tokens,
            "policy/clip_fraction": s["clipped_sum"] / tokens,
            "policy/kl": s["kl_sum"] / tokens,
            "policy/offpolicy_token_share": s["offpolicy_sum"] / tokens,
            "policy/grad_norm": stats["grad_norm"],
            "learner/pad_fraction": s["pad_sum"] / max(s["padded_sum"], 1.0),
            "policy/lr": stats["lr"],
            "tis/weight_mean": s["tis_sum"] / tokens,
            "tis/weight_max": reduce_max(float(tis[mask].max()) if mask.any() else 1.0),
            "tis/capped_fraction": s["tis_capped"] / tokens,
            # Rank 0's own phases: they add up to its step, which the sync barrier aligns with every rank's.
            **{f"timing/{k}": v for k, v in sorted(t.items())},
            "timing/tokens_per_s": s["length"] / max(t["step"], 1e-9),
            "progress/step": step + 1,  # RL steps done: the time axis of Tune's schedulers
            "progress/optimizer_step": self.learner.optimizer_step,
            "faults/service_losses": self.service_losses,
        }
        return metrics

    def validate(self, steps_done: int) -> dict[str, float]:
        """The validation benchmarks judged and summarized as `orchestrator.evaluate` does: each rank
        samples its slice of every benchmark (`validation.samples_of` it), the verifier judges each whole
        assistant turn, rank 0 summarizes all problems. steps_done: the RL steps behind the policy (EAD's s)."""
        v = self.cfg.validation
        prompt = v.prompt or self.cfg.prompt
        mine, texts, tokens, call = [], [], [], 0
        for name, problems in self.val_sets.items():
            k, shard = v.samples_of(name), problems[self.rank :: self.world]
            mine += [(name, problem) for problem in shard]
            per_call = max(1, VALIDATION_SEQUENCES_PER_CALL // k)
            # Every rank makes the same number of calls (generate is a collective round), sized by the largest share.
            for start in range(0, -(-len(problems) // self.world), per_call):
                spec = sampling_spec(v.decoding, self.cfg.rollout.max_new_tokens, steps_done,
                                     seed=(self.cfg.seed * 7919 + 17 + self.rank) * 1009 + call)  # same at every validation
                rollouts = self.generate(self.encode(shard[start : start + per_call], prompt), k, spec)
                texts += [prompt.completion(text) for text in rollouts.texts]
                tokens += [len(r) for r in rollouts.response_ids]
                call += 1
        ends = np.cumsum([0] + [v.samples_of(name) for name, _ in mine])  # problem i's samples: ends[i]:ends[i+1]
        problems = [(texts[ends[i] : ends[i + 1]], p.answer, bool(p.choices)) for i, (_, p) in enumerate(mine)]
        verdicts = self.call(self.verifier, self.verifier.judge.remote(problems), "the verifier")
        rows = [(name, p.uid, p.answer, correct, answers, sum(tokens[ends[i] : ends[i + 1]]))
                for i, ((name, p), (correct, answers)) in enumerate(zip(mine, verdicts))]
        gathered = [rows]
        if dist.is_initialized():
            gathered = [None] * self.world
            dist.all_gather_object(gathered, rows)
        result = [self.summarize_validation([row for part in gathered for row in part]) if self.rank == 0 else None]
        if dist.is_initialized():
            dist.broadcast_object_list(result, src=0)
        return result[0]

    def summarize_validation(self, rows: list[tuple]) -> dict[str, float]:
        """val/<benchmark>/<metric> from every problem's (benchmark, uid, gold, correct, answers, tokens),
        val/macro/* over several benchmarks (the metrics they share), and val/accuracy: each benchmark's
        avg@k (its own k), macro-averaged (the default objective)."""
        metrics, rows_by_name = {}, {}
        for row in sorted(rows, key=lambda r: r[1]):  # problem order does not depend on the ranks
            rows_by_name.setdefault(row[0], []).append(row)
        summaries, accuracy, se = {}, {}, {}
        for name, group in rows_by_name.items():
            _, _, golds, correct, answers, tokens = zip(*group)
            k = self.cfg.validation.samples_of(name)
            summaries[name] = {**self.call(self.verifier, self.verifier.summarize.remote(correct, answers, golds),
                                           "the verifier"),
                               "response_length": sum(tokens) / (k * len(group))}
            accuracy[name] = summaries[name][f"avg@{k}"]
            se[name] = avg_at_k_se([c[:k] for c in correct])
        if len(summaries) > 1:
            summaries["macro"] = macro_row(summaries)
        for name, summary in summaries.items():
            metrics.update({f"val/{name}/{metric_key(key)}": value for key, value in summary.items()})
        every = [s for name, s in summaries.items() if name != "macro"]
        metrics["val/accuracy"] = sum(accuracy.values()) / len(accuracy)
        # Its standard error, the benchmarks independent: the measurement noise in the objective.
        metrics["val/accuracy_se"] = math.sqrt(sum(e * e for e in se.values())) / len(se)
        metrics["val/response_length"] = sum(s["response_length"] for s in every) / len(every)
        return metrics

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, step: int, metrics: dict[str, float]) -> None:
        """Every rank writes and seals its part (trainables/checkpoint.py); Ray Train uploads the
        merged folder and commits it only once every rank's upload is done."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            try:
                self.learner.save(folder, client_state={"step": step})
                torch.save({"step": step, "rng": rng_state()}, Path(folder) / rank_file(self.rank))
                if self.rank == 0:
                    (Path(folder) / TRIAL_STATE).write_text(json.dumps({
                        "step": step, "base_val": self.base_val, "val_history": self.val_history, "metrics": metrics,
                        "model_path": self.model_path, "trial": self.cfg.model_dump(mode="json")}))
                write_manifest(folder, self.rank, self.world)
            except (OSError, RuntimeError) as e:
                if (failure := write_failure(e, folder, step)) is None:
                    raise
                raise failure from e
            if self.logger is not None:
                self.logger.drain()  # every step up to this checkpoint is in MLflow: a resume skips them
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        self.save_seconds = time.perf_counter() - start

    def restore(self) -> None:
        """Continue from the latest intact checkpoint; a corrupt latest one falls back to an older one."""
        latest = ray.train.get_checkpoint()
        if latest is None:
            return
        for checkpoint in self.checkpoints_to_try(latest):
            with checkpoint.as_directory() as folder:
                saved_world = saved_world_size(folder)
                if saved_world not in (None, self.world):
                    raise CheckpointError(
                        f"checkpoint: {checkpoint.path} was saved by {saved_world} learner ranks; resume with "
                        f"learner.num_workers={saved_world} (this run has {self.world})")
                problem = checkpoint_problem(folder, self.world)
                if problem is None:
                    try:
                        self.load_checkpoint(folder)
                    except ValueError as e:  # a rank file holding pickled objects: not read
                        problem = str(e)
                if problem is None:
                    if self.rank == 0:
                        print(f"[trial {self.cfg.name}] resumed after step {self.start_step} from "
                              f"{checkpoint.path}", flush=True)
                    return
            if self.rank == 0:
                print(f"[trial {self.cfg.name}] checkpoint {checkpoint.path} is unusable: {problem}; "
                      f"trying the one before it", flush=True)
        raise CheckpointError(f"checkpoint: no intact checkpoint to resume {self.cfg.name} from "
                              f"(latest: {latest.path})")

    def load_checkpoint(self, folder: str) -> None:
        state = json.loads((Path(folder) / TRIAL_STATE).read_text())
        rank_state = read_rank_state(folder, self.rank)  # before the engine: a refused file loads nothing
        self.learner.load(folder)
        set_rng_state(rank_state["rng"])
        self.start_step = state["step"] + 1
        self.base_val = state["base_val"]
        self.val_history = [(int(done), val) for done, val in state["val_history"]]

    def checkpoints_to_try(self, latest):
        """The latest checkpoint, then the older committed ones, newest first (fetched only if needed)."""
        yield latest
        older = [c for c in ray.train.get_all_reported_checkpoints() if c.checkpoint.path != latest.path]
        for reported in sorted(older, key=lambda c: c.metrics.get("progress/step", 0), reverse=True):
            yield reported.checkpoint

    def stop_requested(self) -> bool:
        """A stop file (the driver got SIGTERM) or `checkpoint.save_by` too close to run another step.

        Rank 0 decides and every rank follows, so all of them stop at the same step boundary.
        """
        stop = False
        if self.rank == 0:
            if self.stop_file:
                fs, path = self.stop_file
                stop = fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound
            deadline = self.cfg.checkpoint.save_by
            if deadline is not None and self.last_step_seconds is not None:
                now = datetime.now(deadline.tzinfo)
                margin = 2 * self.last_step_seconds + (self.save_seconds or self.last_step_seconds)
                stop = stop or (deadline - now).total_seconds() < margin
        return reduce_max(float(stop)) > 0

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self.restore()
        self.sync_weights()  # the service must serve the learner's weights, also after a resume
        if self.logger is not None:
            self.resume_logging()
        # Start-up (Ray, engines, worker group, DeepSpeed, restore) ends here; the cumulative loop wall
        # and logging time let `python -m bench` split a steady state into compute and overhead.
        loop_start = time.perf_counter()
        self.startup_marks["restore_and_sync"] = time.time()
        startup = self.startup_breakdown()
        every = cfg.validation.every
        if every and self.start_step == 0:
            with timed(t := {}, "validate"):
                self.val_history.append((0, self.validate(0)))  # the base policy, before any update
            self.base_val = {f"{k}_base": v for k, v in self.latest_val.items()}
            self.log(-1, {**self.base_val, "timing/validate": t["validate"]})
        last_finite: dict[str, float] = {}
        for step in range(self.start_step, cfg.learner.steps):
            metrics = self.rollout_step(step)
            last_finite = check_finite(metrics, last_finite, f"trial {cfg.name}: step {step + 1}")
            self.last_step_seconds = metrics["timing/step"]
            last = step == cfg.learner.steps - 1
            validated = bool(every) and ((step + 1) % every == 0 or last)
            if validated:
                with timed(t := {}, "validate"):
                    self.val_history.append((step + 1, self.validate(step + 1)))
                metrics.update(self.latest_val, **{"timing/validate": t["validate"]})
                self.log_artifacts(step)
            metrics.update(self.base_val)
            metrics["timing/loop_wall"] = time.perf_counter() - loop_start
            if step == self.start_step:
                metrics.update(startup)
            if self.logger is not None:
                metrics["timing/logging"] = self.logger.seconds
            self.log(step, metrics)
            self.print_progress(step, metrics)
            stop = not last and self.stop_requested()
            notice = None if last or stop else self.notices.new()
            # Every report carries the latest validation, so Tune's schedulers always see the objective.
            reported = {**self.latest_val, **metrics, "progress/preempted": float(stop)}
            if self.val_history:  # which step that validation is of: a searcher keys its value by it
                reported[VAL_STEP] = self.val_history[-1][0]
            start, saved = time.perf_counter(), {}
            if last or stop or notice or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
                self.save_checkpoint(step, reported)
                saved = {"timing/checkpoint": self.save_seconds}
                if notice:
                    self.after_notice(step, notice)
            elif (step + 1) % cfg.logging.report_every == 0 or validated:
                ray.train.report(reported)
            else:
                continue
            self.log(step, {**saved, "timing/report": time.perf_counter() - start})  # a barrier of all ranks
            if stop:
                if self.rank == 0:
                    print(f"[trial {cfg.name}] stopped after step {step + 1} with a checkpoint; "
                          f"--resume continues it", flush=True)
                return

    def after_notice(self, step: int, notice: str) -> None:
        """Checkpointed for a notice: say so; a SIGTERM'd process then leaves (Ray Train restarts the ranks
        from this checkpoint), a drain lets training go on until Ray Train moves the ranks at its deadline."""
        if self.rank == 0:
            print(f"[trial {self.cfg.name}] {notice}: checkpointed after step {step + 1}", flush=True)
        if self.notices.terminating:
            raise WorkerTerminating(f"trial {self.cfg.name}: {notice}; restarting from the checkpoint after step "
                                    f"{step + 1}")

    def startup_breakdown(self) -> dict[str, float]:
        """timing/startup (the driver's start to the first step) and its stages: workers (Ray, the
        actors, Train's worker group, imports), data, learner (model and DeepSpeed), restore_and_sync
        (checkpoint, first weight push). The engines load meanwhile (their health's load_seconds)."""
        if not self.started_at:
            return {}
        times = [self.started_at, *self.startup_marks.values()]
        stages = {f"timing/startup_{name}": end - begin
                  for name, begin, end in zip(self.startup_marks, times, times[1:])}
        return {"timing/startup": times[-1] - times[0], **stages}

    def resume_logging(self) -> None:
        """Rank 0: leave the steps already in the MLflow run alone, and record where the run resumed."""
        logged = self.logger.logged_through(LOGGED_KEYS)
        self.logger.skip_through = logged
        if logged < 0:
            return
        redone = max(logged - self.start_step, 0)  # MLflow step s = RL steps done
        self.logger.log(self.start_step, {"faults/resumed_from_step": self.start_step, "faults/redone_steps": redone},
                        force=True)
        print(f"[trial {self.cfg.name}] MLflow run has steps up to {logged}: {redone} recomputed steps "
              f"will not be logged again", flush=True)

    def print_progress(self, step: int, m: dict[str, float]) -> None:
        if self.rank != 0:
            return
        val = f" val/accuracy {m['val/accuracy']:.3f}" if "val/accuracy" in m else ""
        print(f"[trial {self.cfg.name}] step {step + 1}/{self.cfg.learner.steps} "
              f"reward {m['rollout/reward_mean']:.3f} accuracy {m['rollout/accuracy']:.3f} "
              f"entropy {m['policy/entropy']:.3f} length {m['rollout/response_length']:.1f}{val} "
              f"({m['timing/step']:.1f} s)", flush=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger is not None:
            self.logger.log(step + 1, metrics)  # MLflow step 0 is the base policy

    def log_artifacts(self, step: int) -> None:
        """Rank 0: a sample of this step's rollouts with their rewards, and the validation curve so far."""
        if self.logger is None:
            return
        if self.cfg.logging.rollout_samples and self.last_step_rows is not None:
            problems, rollouts, rewards, offpolicy = self.last_step_rows
            self.logger.log_file(f"rollouts/step_{step + 1:06d}.jsonl", rollout_samples_jsonl(
                step + 1, [p.question for p in problems], [p.answer for p in problems], rollouts.texts,
                rewards.tolist(), rollouts.finish_reasons, offpolicy.tolist(), rollouts.n,
                self.cfg.logging.rollout_samples))
        csv, png = validation_curve(self.val_history, f"{self.cfg.name}: validation")
        self.logger.log_file("validation_curve.csv", csv)
        self.logger.log_file("validation_curve.png", png)


def quiet_report_log() -> None:
    """Ray Train 2.60 logs every report's full metrics at INFO from a logger named by its file path,
    out of reach of `LoggingConfig`; the trial prints its own one-line progress instead."""
    import logging

    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point; `config` carries the validated trial spec as plain data."""
    cfg = TrialConfig.model_validate(config["trial"])
    quiet_report_log()
    arm_sigterm_notice()
    trial = Trial(cfg, config["model_path"], config["rollout_engines"], config["verifier"], config.get("tracking", {}),
                  store=config.get("offline_store"), embedder=config.get("embedding_service"),
                  stop_file=config.get("stop_file"), started_at=config.get("started_at"))
    TRAINING.set()
    try:
        trial.run()
    finally:
        TRAINING.clear()
        if trial.logger is not None:
            trial.logger.close()  # what is queued reaches MLflow before the driver closes the run
