"""The hybrid group of luffy / oger*: teacher trajectories take online slots, OGER adds its reward.

For each prompt's group of N online rollouts (OGER section 3.2, eq. 7-9):
    divergence D_i of each online member from the prompt's offline trajectories (oger*),
    k members replaced by k teacher trajectories drawn at random (seeded) for that prompt:
        the k lowest-D ones (oger*) or the last k slots (luffy),
    rewards: R_m + R_OGER for the online members that stay (R_OGER only where the preset says),
             R_m for the teacher members (scored by the same verifier).
The advantage is then computed over the hybrid group of N, as over an online one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from trainables.algorithms import AlgorithmPreset
from trainables.data.offline import OfflineStore
from trainables.data.prompts import strip_prefill
from trainables.rewards.oger import oger_rewards, replacement_indices
from trainables.rollout.types import RolloutBatch

# (online texts [B], prompt keys [P]) -> (online embeddings [B, d], {key: offline embeddings [M, d]})
EmbedFn = Callable[[list[str], list[str]], tuple[torch.Tensor, dict[str, torch.Tensor]]]
ScoreFn = Callable[[list[str], list[str]], torch.Tensor]  # (texts, gold answers) -> R_m [B]


@dataclass
class HybridGroups:
    rollouts: RolloutBatch  # the hybrid batch: teacher rows in place of the replaced online rows
    rewards: torch.Tensor  # [B], R_m (+ R_OGER for online members)
    offpolicy: torch.Tensor  # bool[B], True on teacher rows
    metrics: dict[str, float]  # per-rank sums, reduced over ranks by the caller


def replaced_slots(preset: AlgorithmPreset, divergence: torch.Tensor | None, n: int, k: int) -> list[int]:
    """Which of the n online slots of a group the k teacher trajectories take."""
    if preset.replacement == "fixed":
        return list(range(n - k, n))  # LUFFY: a fixed slot
    return replacement_indices(divergence, k).tolist()


def teacher_response(text: str, tokenizer, max_tokens: int, prefill: str = "") -> tuple[str, list[int], str]:
    """A teacher text as the policy would continue the prompt: the prompt's prefill stripped from its
    start (`strip_prefill`), as text and as policy tokens with EOS cut at the response cap; and its
    finish reason."""
    text = strip_prefill(text, prefill)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return (text, ids[:max_tokens], "length") if len(ids) > max_tokens else (text, ids, "stop")


def build_hybrid(rollouts: RolloutBatch, keys: list[str], golds: list[str], verifiable: torch.Tensor,
                 last_entropy: torch.Tensor, *, preset: AlgorithmPreset, k: int, store: OfflineStore,
                 embed: EmbedFn | None, score: ScoreFn, tokenizer, max_tokens: int,
                 rng: np.random.Generator, prefill: str = "") -> HybridGroups:
    """Hybrid groups for one rank's batch. keys/golds: [P]; verifiable, last_entropy: [B = P * n].
    Teacher rows hold responses as the policy's are: after the prompt's prefill (`teacher_response`)."""
    n = rollouts.n
    online_emb, offline_emb = embed(rollouts.texts, keys) if preset.needs_embeddings else (None, {})
    rewards = verifiable.clone()  # [B]
    responses, logps = list(rollouts.response_ids), list(rollouts.behaviour_logprobs)
    texts, reasons = list(rollouts.texts), list(rollouts.finish_reasons)
    offpolicy = torch.zeros(len(texts), dtype=torch.bool)
    divergence_all, exploration_all = torch.zeros(len(texts)), torch.zeros(len(texts))  # [B]
    scored = torch.zeros(len(texts), dtype=torch.bool)  # online members OGER scored
    no_offline = 0
    for g, key in enumerate(keys):
        rows = slice(g * n, (g + 1) * n)
        teachers = store.for_prompt(key)
        if not teachers:
            no_offline += 1  # nothing to mix in: the group stays online
            continue
        divergence = None
        if online_emb is not None:
            out = oger_rewards(online_emb[rows], offline_emb[key], last_entropy[rows], verifiable[rows],
                               refine=preset.refine)
            divergence = out["divergence"]
            if preset.exploration_reward:
                rewards[rows] = out["total"]
            divergence_all[rows], exploration_all[rows], scored[rows] = divergence, out["exploration"], True
        for slot, pick in zip(replaced_slots(preset, divergence, n, k),
                              rng.choice(len(teachers), size=k, replace=len(teachers) < k)):
            row, teacher = g * n + slot, teachers[int(pick)]
            texts[row], responses[row], reasons[row] = teacher_response(teacher.text, tokenizer, max_tokens, prefill)
            logps[row] = [0.0] * len(responses[row])  # unused: teacher tokens take no ratio and no TIS
            offpolicy[row] = True
    if offpolicy.any():
        teacher_rows = offpolicy.nonzero().flatten().tolist()
        rewards[offpolicy] = score([texts[i] for i in teacher_rows], [golds[i // n] for i in teacher_rows])
    hybrid = replace(rollouts, response_ids=responses, behaviour_logprobs=logps, texts=texts, finish_reasons=reasons)
    return HybridGroups(hybrid, rewards, offpolicy, _metric_sums(
        offpolicy, scored & ~offpolicy, verifiable, rewards, divergence_all, exploration_all, last_entropy, no_offline))


def _metric_sums(offpolicy, kept_scored, verifiable, rewards, divergence, exploration, last_entropy,
                 no_offline: int) -> dict[str, float]:
    """Per-rank sums over the online members that stay (OGER's) and the teacher members."""
    return {
        "replaced": float(offpolicy.sum()), "no_offline_groups": float(no_offline),
        "online": float((~offpolicy).sum()), "online_correct": float(verifiable[~offpolicy].sum()),
        "offline_correct": float(rewards[offpolicy].sum()),
        "oger_scored": float(kept_scored.sum()),
        "oger_divergence": float(divergence[kept_scored].sum()),
        "oger_entropy": float(last_entropy[kept_scored].sum()),
        "oger_exploration": float(exploration[kept_scored].sum()),
        "oger_exploration_max": float(exploration[kept_scored].max()) if kept_scored.any() else 0.0,
    }
