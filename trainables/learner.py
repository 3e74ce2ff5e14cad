"""The DeepSpeed GRPO learner of one rank: old-logprob pass, policy update, weight export.

Loss normalisation: `aggregate_loss` divides each micro-batch's sum by the GLOBAL token or sequence
count of the optimizer batch (all micro-batches, all ranks), so the loss and its gradient are the
same whatever the micro-batching and the number of ranks. DeepSpeed would divide by the number of
accumulation steps (we pass `scale_wrt_gas=False`) and averages gradients over ranks (we multiply
by the world size to turn the average back into that global sum).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from trainables.algo.advantages import group_advantages
from trainables.algo.batching import pad_tokens, split_to, token_budget_groups
from trainables.algo.logprobs import token_logprobs
from trainables.algo.losses import STAT_KEYS, entropy_from_logits, policy_objective, tis_weights
from trainables.config import TrialConfig
from trainables.rollout.types import RolloutBatch
from trainables.rollout.weight_sync import TensorMeta
from trainables.runtime.checkpoint import allow_deepspeed_records


@dataclass
class TrainBatch:
    """Prompt + response rows, right-padded. Token tensors are in target coordinates: column j holds
    token j + 1 of the row and the log-prob the model assigns to it from position j."""

    input_ids: torch.Tensor  # long[B, L]
    attention_mask: torch.Tensor  # long[B, L]
    response_mask: torch.Tensor  # bool[B, L-1], True on response tokens (EOS included)
    behaviour_logp: torch.Tensor  # [B, L-1], log-prob under the distribution sampled from
    temperature: torch.Tensor | None = None  # [B, L-1], what the learner divides each target's logits by; None: 1

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice) -> TrainBatch:
        return TrainBatch(
            *(t[index] for t in (self.input_ids, self.attention_mask, self.response_mask, self.behaviour_logp)),
            None if self.temperature is None else self.temperature[index],
        )


@dataclass
class RLUpdate:
    advantages: torch.Tensor  # [B]
    tis: torch.Tensor  # [B, T] truncated importance weights
    stats: dict[str, float]  # the update's per-rank sums (`Learner.update`)


def pad_right(rows: list[list[float]] | list[list[int]], value: float, dtype: torch.dtype) -> torch.Tensor:
    """Ragged rows -> [B, max_len] tensor padded with value."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def build_train_batch(rollouts: RolloutBatch, pad_id: int, taus: tuple[float, ...] | None = None) -> TrainBatch:
    """The rollouts as learner rows. taus: the temperature of each response position t (the rollout's
    schedule, `algorithm.logprob_temperature: rollout`), or None: the learner's log-probs at T = 1."""
    rows = [rollouts.prompt_of(i) + r for i, r in enumerate(rollouts.response_ids)]
    input_ids = pad_right(rows, pad_id, torch.long)  # [B, L]
    attention = pad_right([[1] * len(r) for r in rows], 0, torch.long)  # [B, L]
    response_mask = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, dtype=torch.bool)
    behaviour = torch.zeros(response_mask.shape)
    temperature = None if taus is None else torch.ones(response_mask.shape)  # [B, L-1]
    for i, resp in enumerate(rollouts.response_ids):
        start = len(rollouts.prompt_of(i)) - 1  # target column of the first response token
        response_mask[i, start : start + len(resp)] = True
        behaviour[i, start : start + len(resp)] = torch.tensor(rollouts.behaviour_logprobs[i])
        if temperature is not None:
            temperature[i, start : start + len(resp)] = torch.tensor(taus[: len(resp)])
    return TrainBatch(input_ids, attention, response_mask, behaviour, temperature)


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """bool[B, T] -> long[B]: the column of each row's last response token.

    "Last" is the position that emitted the final token: EOS for a finished response, the cut-off
    token for a truncated one.
    """
    cols = torch.arange(response_mask.shape[1]).expand_as(response_mask)
    return torch.where(response_mask, cols, -1).max(dim=1).values.clamp(min=0)


def last_token_entropy(
    entropy: torch.Tensor, response_mask: torch.Tensor, finished: torch.Tensor, where: str
) -> torch.Tensor:
    """OGER eq. 6 input: H at each row's last position. entropy [B, T], mask bool[B, T], finished bool[B].

    where="eos": the position that emitted the final token (EOS when finished), the paper's literal
    "last token". where="content": for a finished row of two or more tokens, the position that
    emitted the last token before EOS (EOS itself is near-certain, so its entropy says little).
    Returns [B].
    """
    last = last_token_index(response_mask)  # [B]
    if where == "content":
        last = torch.where(finished & (response_mask.sum(1) > 1), last - 1, last)
    return entropy.gather(1, last[:, None]).squeeze(1)


def align_columns(values: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T] -> [B, width]: cut or zero-pad on the right (rows share their column coordinates)."""
    return torch.nn.functional.pad(values[:, :width], (0, max(0, width - values.shape[1])))


def process_group_backend(use_gpu: bool) -> str:
    """The learner ranks' torch.distributed backend. On GPUs a NCCL-only group refuses CPU tensors, and
    the ranks all-reduce their token counts, metrics and stop votes as CPU tensors: those go over gloo."""
    return "cpu:gloo,cuda:nccl" if use_gpu else "gloo"


def deepspeed_config(cfg: TrialConfig, world_size: int, micro_batches: int, bf16: bool) -> dict:
    lr = cfg.learner
    micro = math.ceil(cfg.sequences_per_minibatch / micro_batches)
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": micro_batches,
        "train_batch_size": micro * micro_batches * world_size,
        "gradient_clipping": lr.grad_clip or 0.0,
        "zero_optimization": {"stage": lr.zero_stage},
        "bf16": {"enabled": bf16},
        # torch's AdamW: DeepSpeed's default FusedAdam JIT-compiles for minutes on a CPU.
        "optimizer": {"type": "AdamW", "params": {"lr": lr.lr, "weight_decay": lr.weight_decay, "torch_adam": True}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if lr.warmup_steps:
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lr.lr,
                "warmup_num_steps": lr.warmup_steps,
                "warmup_type": "linear",
            },
        }
    return config


def response_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    temperature: torch.Tensor | None,
    *,
    chunk_tokens: int | None,
    entropy: str,
    min_chunks: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM's (log pi(y_t) [B, T], H_t [B, T]) for input_ids long[B, T + 1] at mask bool[B, T]: the
    decoder, then the head one chunk of positions at a time (`trainables.algo.logprobs`), or with chunk_tokens
    None the straightforward pass, logits [B, T, V] in fp32. H is zeros for entropy "none"."""
    if chunk_tokens is not None:
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state[:, :-1]  # [B, T, H]
        logp, ent = token_logprobs(
            model.get_output_embeddings(),
            hidden,
            input_ids[:, 1:],
            mask,
            temperature,
            chunk_tokens=chunk_tokens,
            entropy=entropy,
            min_chunks=min_chunks,
        )
        return logp, torch.zeros_like(logp) if ent is None else ent
    logits = (
        type(model)
        .forward(model, input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        .logits[:, :-1]
        .float()
    )  # [B, T, V]
    if temperature is not None:
        logits = logits / temperature[..., None]
    logp = logits.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T]
    if entropy == "none":
        return logp, torch.zeros_like(logp)
    return logp, entropy_from_logits(logits if entropy == "grad" else logits.detach())


class Learner:
    """One data-parallel rank. All ranks call every method the same number of times (collectives)."""

    def __init__(self, model_path: str | Path, cfg: TrialConfig, *, world_size: int, device: str = "cpu"):
        import deepspeed

        allow_deepspeed_records()  # its checkpoints load weights-only (trainables/runtime/checkpoint.py)

        # The shared-memory allreduce op would JIT-compile for ~2 minutes; gloo is as good here.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self.cfg = cfg
        self.world_size = world_size
        self.device = device
        bf16 = cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and device != "cpu")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if cfg.learner.gradient_checkpointing:  # the model's own switch: layers recomputed in backward
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.micro_batches = math.ceil(cfg.sequences_per_minibatch / cfg.learner.micro_batch_size)
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, world_size, self.micro_batches, bf16),
        )
        module = self.engine.module
        module.forward = functools.partial(response_logprobs, module)  # what the engine's forward computes
        self.reference = None
        if cfg.algorithm.kl_coef > 0:  # a frozen copy of the initial policy
            self.reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
            self.reference.eval().requires_grad_(False)

    @property
    def optimizer_step(self) -> int:
        return int(self.engine.global_steps)

    def _forward(self, model, batch: TrainBatch, entropy: str = "value") -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logp [B, T], entropy [B, T] or None; ENTROPY_MODES) of the batch's response targets at its
        temperature, trimmed to its longest row. model: the DeepSpeed engine (its module's forward is
        `response_logprobs`, so ZeRO-3 gathers and releases every parameter inside the engine's forward)
        or a plain causal LM (the reference)."""
        width = int(batch.attention_mask.sum(1).max())
        cols = slice(0, width - 1)  # column j holds token j + 1
        temperature = None if batch.temperature is None else batch.temperature[:, cols].to(self.device)
        forward = model if model is self.engine else functools.partial(response_logprobs, model)
        mask = batch.response_mask[:, cols]
        logp, ent = forward(
            batch.input_ids[:, :width].to(self.device),
            batch.attention_mask[:, :width].to(self.device),
            mask.to(self.device),
            temperature,
            chunk_tokens=self.cfg.learner.logits_chunk_tokens,
            entropy=entropy,
            min_chunks=self._head_calls(mask, model),
        )
        pad = (0, batch.response_mask.shape[1] - (width - 1))
        return F.pad(logp, pad), None if entropy == "none" else F.pad(ent, pad)

    def _head_calls(self, mask: torch.Tensor, model) -> int:
        """Chunks of the head to run: this rank's, or under ZeRO-3 the most any rank needs, since each
        call of the partitioned head gathers its weights, a collective every rank must make as often
        (ranks whose response lengths differ would otherwise wait on each other forever)."""
        chunk = self.cfg.learner.logits_chunk_tokens
        if chunk is None or model is not self.engine or self.cfg.learner.zero_stage != 3 or not dist.is_initialized():
            return 0
        count = torch.tensor([math.ceil(int(mask.sum()) / chunk)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count)

    def _micro_batches(self, batch: TrainBatch, rows: range) -> tuple[list[list[int]], tuple[int, int]]:
        """Row indices of each micro-batch over `rows`: `micro_batch_size` rows each, or grouped by
        `learner.max_tokens_per_micro_batch` (every rank runs as many as the rank that needs most); and
        their (padding, padded) token counts."""
        lengths = batch.attention_mask[rows.start : rows.stop].sum(1).tolist()
        budget = self.cfg.learner.max_tokens_per_micro_batch
        if budget:
            groups = token_budget_groups(lengths, budget)
            count = torch.tensor([len(groups)])
            if dist.is_initialized():
                dist.all_reduce(count, op=dist.ReduceOp.MAX)
            groups = split_to(groups, int(count))
        else:
            step = math.ceil(len(lengths) / self.micro_batches)
            groups = [list(range(i, min(i + step, len(lengths)))) for i in range(0, len(lengths), step)]
        return [[rows.start + i for i in group] for group in groups], pad_tokens(lengths, groups)

    @torch.no_grad()
    def old_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass before the update, at the batch's temperature: (logp_old [B, T], entropy [B, T])."""
        self.engine.eval()
        logp_old, entropy = torch.zeros(batch.response_mask.shape), torch.zeros(batch.response_mask.shape)
        for group in self._micro_batches(batch, range(batch.size))[0]:
            logp, ent = self._forward(self.engine, batch.rows(group))
            logp_old[group], entropy[group] = logp.cpu(), ent.cpu()
        return logp_old, entropy

    @property
    def fuses_old_pass(self) -> bool:
        """One optimizer step per RL step: until it, the policy is the one that the old log-probs are of, so
        the update's own forward pass gives them (`rl_update` with logp_old None), one pass fewer."""
        return self.cfg.learner.minibatches == 1

    def rl_update(
        self,
        batch: TrainBatch,
        grouped: torch.Tensor,
        logp_old: torch.Tensor | None,
        offpolicy: torch.Tensor | None = None,
    ) -> RLUpdate:
        """The RL step after the rewards: group advantages of the rewards grouped [P, N] (the batch's rows
        in order), TIS weights [B, T] of the old log-probs over the behaviour's, then `update`. With
        logp_old None (only where `fuses_old_pass`) each micro-batch's update pass gives its old
        log-probs, detached, and so its TIS weights."""
        algo, ro = self.cfg.algorithm, self.cfg.rollout
        advantages = group_advantages(grouped, use_std=algo.use_std).flatten()  # [B = P * N]
        if logp_old is None:
            if not self.fuses_old_pass:
                raise ValueError("the old log-probs come from the update's pass only with one optimizer step")
            tis = torch.zeros(batch.response_mask.shape)  # [B, T], each micro-batch's filled in by `update`
        else:
            tis = tis_weights(
                logp_old, batch.behaviour_logp, ro.tis_cap, mask=batch.response_mask, level=ro.tis_level
            )  # [B, T]
        return RLUpdate(advantages, tis, self.update(batch, advantages, logp_old, tis, offpolicy))

    def update(
        self,
        batch: TrainBatch,
        advantages: torch.Tensor,
        logp_old: torch.Tensor | None,
        tis: torch.Tensor,
        offpolicy: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """`minibatches` optimizer steps over the rank's batch; advantages [B], tis [B, T] (logp_old None:
        both from each micro-batch's own pass, written into `tis`; see `rl_update`).

        offpolicy: bool[B], True on teacher rows: their tokens take LUFFY's shaped loss -A f(p), with
        no ratio, clip or TIS; the other rows keep the PPO/TIS term (`trainables.algo.losses.policy_objective`).
        Returns per-rank sums for metrics (`*_sum` over response tokens and the padding, plus `tokens`),
        read from the device once.
        """
        offpolicy = torch.zeros(batch.size, dtype=torch.bool) if offpolicy is None else offpolicy
        self.engine.train()
        totals, padding = dict.fromkeys(STAT_KEYS, 0.0), torch.zeros(2)
        per_minibatch = batch.size // self.cfg.learner.minibatches
        for m in range(self.cfg.learner.minibatches):
            rows = range(m * per_minibatch, (m + 1) * per_minibatch)
            norm = self._normalisers(batch.response_mask[rows.start : rows.stop])
            groups, waste = self._micro_batches(batch, rows)
            padding += torch.tensor(waste)
            for i, group in enumerate(groups):
                self.engine.set_gradient_accumulation_boundary(i == len(groups) - 1)  # a step after the last
                loss, stats = self._micro_loss(batch, group, advantages, logp_old, tis, offpolicy, norm)
                self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
                self.engine.step()
                totals = {key: totals[key] + stats[key].double() for key in STAT_KEYS}
        sums = dict(zip((f"{key}_sum" for key in STAT_KEYS), torch.stack(list(totals.values())).tolist()))
        sums |= {"pad_sum": float(padding[0]), "padded_sum": float(padding[1])}
        sums |= {
            "grad_norm": float(self.engine.get_global_grad_norm() or 0.0),  # the last optimizer step's
            "tokens": float(batch.response_mask.sum()),
            "lr": float(self.engine.get_lr()[0]),
        }
        return sums

    def _normalisers(self, mask: torch.Tensor) -> dict[str, float]:
        """The optimizer batch's global token and sequence counts (all ranks), and the constant length."""
        counts = torch.tensor([mask.sum(), mask.any(1).sum()], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(counts)
        return {"num_tokens": counts[0].item(), "num_seqs": counts[1].item(), "norm_len": self.cfg.loss_norm_len}

    def _micro_loss(self, batch, group, advantages, logp_old, tis, offpolicy, norm):
        """One micro-batch's share of the loss and its per-token sums (`policy_objective`)."""
        algo, ro, micro = self.cfg.algorithm, self.cfg.rollout, batch.rows(group)
        logp, entropy = self._forward(self.engine, micro, "grad" if algo.entropy_coef else "value")
        on = lambda t: t[group].to(self.device)  # noqa: E731 - this micro-batch's rows on the learner's device
        mask = micro.response_mask.to(self.device)
        if logp_old is None:  # no optimizer step yet since the rollouts: this pass is the old one
            old = logp.detach()
            weights = tis_weights(old, micro.behaviour_logp.to(self.device), ro.tis_cap, mask=mask, level=ro.tis_level)
            tis[group] = weights.cpu()  # the step's TIS metrics
        else:
            old, weights = on(logp_old), on(tis)
        logp_ref = None
        if self.reference is not None:
            with torch.no_grad():
                logp_ref, _ = self._forward(self.reference, micro, "none")
        return policy_objective(
            logp,
            old,
            on(advantages),
            weights,
            on(offpolicy),
            mask,
            entropy=entropy,
            logp_ref=logp_ref,
            clip_low=algo.clip_low,
            clip_high=algo.clip_high,
            dual_clip=algo.dual_clip,
            shaping_gamma=algo.shaping_gamma,
            entropy_coef=algo.entropy_coef,
            kl_coef=algo.kl_coef,
            loss_agg=algo.loss_agg,
            **norm,
        )

    def weight_metas(self) -> list[TensorMeta]:
        """Name, whole shape and dtype of each tensor the engines load (the module's state dict, in its
        order), read without gathering anything: a ZeRO-3 parameter knows its whole shape."""
        return [
            TensorMeta(name, tuple(getattr(t, "ds_shape", t.shape)), t.dtype)
            for name, t in self.engine.module.state_dict(keep_vars=True).items()
        ]

    @contextlib.contextmanager
    def gathered(self, names: list[str], device: str | torch.device | None = None):
        """The whole tensors of `names` (one bucket of the state dict) on `device` (None: where they are),
        alive inside the block. Under ZeRO-3 they are gathered for it (a collective every rank makes, with
        the same names) and released after; under ZeRO 1/2 they are the parameters themselves, copied only
        to another device. The whole model never exists twice on a rank."""
        tensors = self.engine.module.state_dict(keep_vars=True)  # the parameters, not copies
        wanted = {name: tensors[name] for name in names}
        gathered = contextlib.nullcontext()
        partitioned = list({id(t): t for t in wanted.values() if hasattr(t, "ds_id")}.values())  # tied: once
        if self.cfg.learner.zero_stage == 3 and partitioned:
            import deepspeed

            gathered = deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)
        with gathered:
            yield {name: t.detach().to(device or t.device) for name, t in wanted.items()}

    def full_state_dict(self, keep_device: bool = False) -> dict[str, torch.Tensor]:
        """The whole weights as copies, on the CPU or with `keep_device` on the learner's device (a
        collective under ZeRO-3; every rank must call it): checkpoints' exports and checks compare them.
        The weight push goes a bucket at a time instead (`gathered`)."""
        with self.gathered([meta.name for meta in self.weight_metas()]) as whole:
            # Under ZeRO 1/2 every parameter is a view into one flat buffer, and pickling a view ships the
            # whole buffer: each is copied.
            return {k: v.to(v.device if keep_device else "cpu", copy=True) for k, v in whole.items()}

    def save(self, folder: str | Path, client_state: dict) -> None:
        self.engine.save_checkpoint(str(folder), tag="engine", client_state=client_state)

    def load(self, folder: str | Path) -> dict:
        _, client_state = self.engine.load_checkpoint(str(folder), tag="engine")
        return client_state or {}
