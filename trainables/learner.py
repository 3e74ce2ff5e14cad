"""The DeepSpeed GRPO learner of one rank: old-logprob pass, policy update, weight export.

Loss normalisation: `aggregate_loss` divides each micro-batch's sum by the GLOBAL token or sequence
count of the optimizer batch (all micro-batches, all ranks), so the loss and its gradient are the
same whatever the micro-batching and the number of ranks. DeepSpeed would divide by the number of
accumulation steps (we pass `scale_wrt_gas=False`) and averages gradients over ranks (we multiply
by the world size to turn the average back into that global sum).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from trainables.config import TrialConfig
from trainables.losses import aggregate_loss, entropy_from_logits, kl_k3, policy_shaping_loss, ppo_token_loss
from trainables.rollout.types import RolloutBatch, pad_right


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
        return TrainBatch(*(t[index] for t in (self.input_ids, self.attention_mask, self.response_mask,
                                                 self.behaviour_logp)),
                          None if self.temperature is None else self.temperature[index])


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


def last_token_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, finished: torch.Tensor,
                       where: str) -> torch.Tensor:
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
    micro = math.ceil(cfg.sequences_per_rank / lr.minibatches / micro_batches)
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": micro_batches,
        "train_batch_size": micro * micro_batches * world_size,
        "gradient_clipping": lr.grad_clip or 0.0,
        "zero_optimization": {"stage": lr.zero_stage},
        "bf16": {"enabled": bf16},
        # torch's AdamW: DeepSpeed's default FusedAdam JIT-compiles for minutes on a CPU.
        "optimizer": {"type": "AdamW", "params": {"lr": lr.lr, "weight_decay": lr.weight_decay,
                                                  "torch_adam": True}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if lr.warmup_steps:
        config["scheduler"] = {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": lr.lr, "warmup_num_steps": lr.warmup_steps,
            "warmup_type": "linear"}}
    return config


class Learner:
    """One data-parallel rank. All ranks call every method the same number of times (collectives)."""

    def __init__(self, model_path: str | Path, cfg: TrialConfig, *, world_size: int, device: str = "cpu"):
        import deepspeed

        # The shared-memory allreduce op would JIT-compile for ~2 minutes; gloo is as good here.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self.cfg = cfg
        self.world_size = world_size
        self.device = device
        bf16 = cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and device != "cpu")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.micro_batches = math.ceil(cfg.sequences_per_rank / cfg.learner.minibatches
                                       / cfg.learner.micro_batch_size)
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, world_size, self.micro_batches, bf16),
        )
        self.reference = None
        if cfg.algorithm.kl_coef > 0:  # a frozen copy of the initial policy
            self.reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
            self.reference.eval().requires_grad_(False)

    @property
    def optimizer_step(self) -> int:
        return int(self.engine.global_steps)

    def _forward(self, model, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp [B, T], logits [B, T, V]) of the batch's targets at the batch's temperature, trimmed to
        its longest row."""
        width = int(batch.attention_mask.sum(1).max())
        ids = batch.input_ids[:, :width].to(self.device)
        logits = model(input_ids=ids, attention_mask=batch.attention_mask[:, :width].to(self.device)).logits
        logits = logits[:, :-1].float()  # [B, width-1, V]: position j predicts token j + 1
        if batch.temperature is not None:  # the rollout's tempered policy: logits / tau_t
            logits = logits / batch.temperature[:, : width - 1, None].to(self.device)
        logp = logits.log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        pad = batch.response_mask.shape[1] - logp.shape[1]
        return torch.nn.functional.pad(logp, (0, pad)), torch.nn.functional.pad(logits, (0, 0, 0, pad))

    def _micro_slices(self, size: int) -> list[slice]:
        step = math.ceil(size / self.micro_batches)
        return [slice(i, min(i + step, size)) for i in range(0, size, step)]

    @torch.no_grad()
    def old_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass before the update, at the batch's temperature: (logp_old [B, T], entropy [B, T])."""
        self.engine.eval()
        logps, entropies = [], []
        for rows in self._micro_slices(batch.size):
            logp, logits = self._forward(self.engine, batch.rows(rows))
            logps.append(logp.cpu())
            entropies.append(entropy_from_logits(logits).cpu())
        return torch.cat(logps), torch.cat(entropies)

    def update(self, batch: TrainBatch, advantages: torch.Tensor, logp_old: torch.Tensor,
               tis: torch.Tensor, offpolicy: torch.Tensor | None = None) -> dict[str, float]:
        """`minibatches` optimizer steps over the rank's batch; advantages [B], tis [B, T].

        offpolicy: bool[B], True on teacher rows: their tokens take LUFFY's shaped loss -A f(p), with
        no ratio, clip or TIS; the other rows keep the PPO/TIS term.
        Returns per-rank sums for metrics (`*_sum` over response tokens, plus `tokens`).
        """
        if offpolicy is None:
            offpolicy = torch.zeros(batch.size, dtype=torch.bool)
        self.engine.train()
        algo = self.cfg.algorithm
        sums: dict[str, float] = {}
        rows_per_minibatch = batch.size // self.cfg.learner.minibatches
        for m in range(self.cfg.learner.minibatches):
            mb = slice(m * rows_per_minibatch, (m + 1) * rows_per_minibatch)
            mask = batch.response_mask[mb]
            counts = torch.tensor([mask.sum(), mask.any(1).sum()], dtype=torch.float64)
            if dist.is_initialized():
                dist.all_reduce(counts)  # global tokens and sequences of this optimizer batch
            norm = {"num_tokens": counts[0].item(), "num_seqs": counts[1].item(), "norm_len": self.cfg.loss_norm_len}
            base = mb.start
            for rows in self._micro_slices(rows_per_minibatch):
                idx = slice(base + rows.start, base + rows.stop)
                micro = batch.rows(idx)
                logp, logits = self._forward(self.engine, micro)
                mmask = micro.response_mask.to(self.device)
                adv = advantages[idx].to(self.device)
                pg, clipped = ppo_token_loss(logp, logp_old[idx].to(self.device), adv,
                                             clip_low=algo.clip_low, clip_high=algo.clip_high,
                                             dual_clip=algo.dual_clip)
                pg = pg * tis[idx].to(self.device)
                teacher = offpolicy[idx].to(self.device)[:, None]  # [b, 1]
                if teacher.any():
                    shaped = policy_shaping_loss(logp, adv, gamma=algo.shaping_gamma)
                    pg, clipped = torch.where(teacher, shaped, pg), clipped & ~teacher
                entropy = entropy_from_logits(logits)
                loss = aggregate_loss(algo.loss_agg, pg, mmask, **norm)
                if algo.entropy_coef:
                    loss = loss - algo.entropy_coef * aggregate_loss(algo.loss_agg, entropy, mmask, **norm)
                kl = torch.zeros_like(logp)
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logp, _ = self._forward(self.reference, micro)
                    kl = kl_k3(logp, ref_logp)
                    loss = loss + algo.kl_coef * aggregate_loss(algo.loss_agg, kl, mmask, **norm)
                self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
                self.engine.step()  # an optimizer step only at the accumulation boundary
                for key, val in (("pg_loss", pg), ("entropy", entropy), ("clipped", clipped.float()),
                                 ("kl", kl), ("offpolicy", teacher.expand_as(pg).float())):
                    sums[f"{key}_sum"] = sums.get(f"{key}_sum", 0.0) + float((val.detach() * mmask).sum())
            sums["grad_norm"] = float(self.engine.get_global_grad_norm() or 0.0)
        sums["tokens"] = float(batch.response_mask.sum())
        sums["lr"] = float(self.engine.get_lr()[0])
        return sums

    def full_state_dict(self, keep_device: bool = False) -> dict[str, torch.Tensor]:
        """Full weights for the rollout engine (collective under ZeRO-3; every rank must call it), as
        copies on the CPU, or on the learner's device with `keep_device` (a NCCL transfer sends them)."""
        module = self.engine.module

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            # Under ZeRO 1/2 every parameter is a view into one flat buffer, and pickling a view ships
            # the whole buffer: clone, or each of the ~50 tensors drags all the weights along.
            return tensor.detach().to(tensor.device if keep_device else "cpu", copy=True)

        gathered = contextlib.nullcontext()
        if self.cfg.learner.zero_stage == 3:  # each rank holds a shard: gather the whole of every parameter
            import deepspeed

            gathered = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
        with gathered:
            return {k: copy(v) for k, v in module.state_dict().items()}

    def save(self, folder: str | Path, client_state: dict) -> None:
        self.engine.save_checkpoint(str(folder), tag="engine", client_state=client_state)

    def load(self, folder: str | Path) -> dict:
        _, client_state = self.engine.load_checkpoint(str(folder), tag="engine")
        return client_state or {}
