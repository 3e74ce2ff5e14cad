"""The CPU (and small-GPU) generation engine: transformers `generate` with a per-token schedule.

transformers appends custom logits processors after its own warpers and samples with top_k=50 by
default, so the engine turns every built-in warper off (temperature 1, top_k 0, top_p 1) and applies
the schedule's temperature and then nucleus filtering itself: the scores `generate` returns are
then exactly the distribution the token was sampled from, which is what TIS needs.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from trainables.data.models import load_policy
from trainables.rollout.ead import tau_table
from trainables.rollout.types import RolloutBatch, SamplingSpec


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose mass reaches top_p. [B, V] -> [B, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already enough
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class ScheduledTemperature(LogitsProcessor):
    """Divides the logits of generated token t by the schedule's tau_t, then applies top_p."""

    def __init__(self, spec: SamplingSpec, prompt_width: int):
        # [max_new_tokens]; moved to the logits' dtype and device at the first call (a no-op after)
        self.tau_by_position = torch.tensor(tau_table(spec.schedule, spec.params, spec.step, spec.max_new_tokens))
        self.spec = spec
        self.prompt_width = prompt_width  # prompts are left-padded to one width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids [B, prompt_width + t]: t tokens generated so far, so this is token index t for
        # every row of the static batch.
        t = input_ids.shape[1] - self.prompt_width
        self.tau_by_position = self.tau_by_position.to(scores)
        return top_p_filter(scores / self.tau_by_position[t], self.spec.top_p)


class HFEngine:
    """A causal LM in this process, generating with `SamplingSpec`s; weights replaceable in place."""

    def __init__(self, model_path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        self.model, self.tokenizer = load_policy(model_path, dtype)
        self.model.to(device).eval()
        self.device = device
        self.weight_version = 0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> RolloutBatch:
        start = time.perf_counter()
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        rows = [p for p in prompts for _ in range(n)]  # prompt-major, n copies each
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [P*n, W], left-padded
        attention = torch.zeros_like(input_ids)
        for i, p in enumerate(rows):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        torch.manual_seed(spec.seed)
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            max_new_tokens=spec.max_new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            logits_processor=LogitsProcessorList([ScheduledTemperature(spec, width)]),
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        new = out.sequences[:, width:].cpu()  # [P*n, T]
        scores = torch.stack(out.scores, dim=1).float().cpu()  # [P*n, T, V], as sampled
        logp = scores.log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [P*n, T]
        responses, logprobs, reasons = [], [], []
        for row, row_logp in zip(new.tolist(), logp.tolist()):
            length = row.index(eos) + 1 if eos in row else len(row)  # keep the EOS: it is learned
            responses.append(row[:length])
            logprobs.append(row_logp[:length])
            reasons.append("stop" if eos in row else "length")
        return RolloutBatch.decoded(
            self.tokenizer,
            prompts,
            responses,
            logprobs,
            reasons,
            n,
            self.weight_version,
            {"generate": time.perf_counter() - start},
        )

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        """Load a full state dict (names as in the learner's module) and record its version."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
        if missing or unexpected:
            raise ValueError(
                f"weight update does not match the engine's model: missing={missing[:3]} "
                f"unexpected={unexpected[:3]}; learner and rollout must load the same model"
            )
        self.weight_version = version
        return version
