"""The hybrid group of luffy / oger*: teacher trajectories take online slots, OGER adds its reward.

For each prompt's group of N online rollouts (OGER section 3.2, eq. 7-9):
    divergence D_i of each online member from the prompt's offline trajectories (oger*),
    k members replaced by k teacher trajectories drawn at random (seeded) for that prompt:
        the k lowest-D ones (oger*) or the last k slots (luffy),
    rewards: R_m + R_OGER for the online members that stay (R_OGER only where the preset says),
             R_m for the teacher members (scored by the same verifier).
The advantage is then computed over the hybrid group of N, as over an online one.

`hybrid_rewards` is that rule as a pure function of [P, N] tensors; `mix_teachers` is the adapter that
draws the teachers and splices their rows into the rollout batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from trainables.algo.algorithms import AlgorithmPreset
from trainables.data.offline import OfflineStore
from trainables.data.prompts import strip_prefill
from trainables.rewards.oger import divergence, exploration_reward, replacement_indices
from trainables.rollout.types import RolloutBatch

ScoreFn = Callable[[list[str], list[str]], torch.Tensor]  # (texts, gold answers) -> R_m [B]


@dataclass
class HybridGroups:
    rollouts: RolloutBatch  # the hybrid batch: teacher rows in place of the replaced online rows
    rewards: torch.Tensor  # [B], R_m (+ R_OGER for online members)
    offpolicy: torch.Tensor  # bool[B], True on teacher rows
    metrics: dict[str, float]  # per-rank sums, reduced over ranks by the caller


def hybrid_rewards(
    verifiable: torch.Tensor,
    last_entropy: torch.Tensor,
    divergence: torch.Tensor | None,
    *,
    k: int,
    lowest_divergence: bool,
    exploration: bool,
    refine: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OGER eq. 7-8 and section 3.2 over P groups of N: (rewards [P, N], R_m + R_OGER where `exploration`
    else R_m; the k replaced slots long[P, k]: the lowest-D ones with `lowest_divergence` (ties to the
    lower index), else LUFFY's last k; R_OGER [P, N]).

    verifiable: R_m [P, N]; last_entropy: H [P, N]; divergence: D [P, N], or None without embeddings.
    The teacher members' rewards are theirs, set after they are scored.
    """
    p, n = verifiable.shape
    r_oger = torch.zeros(p, n)
    if divergence is not None:
        r_oger = exploration_reward(divergence, last_entropy, verifiable, refine=refine)  # [P, N]
    rewards = verifiable.to(r_oger.dtype) + r_oger if exploration else verifiable.clone()  # [P, N]
    if lowest_divergence:
        replaced = torch.stack([replacement_indices(d, k) for d in divergence]) if p else torch.zeros(0, k)
    else:
        replaced = torch.arange(n - k, n).expand(p, k)  # LUFFY: a fixed slot
    return rewards, replaced.long(), r_oger


def group_divergence(online_emb: torch.Tensor, offline_emb: list[torch.Tensor | None], n: int) -> torch.Tensor:
    """D [P, N] of each group's online members (online_emb [P * N, d]) from its offline trajectories
    (offline_emb [P], each [M, d]; None: a group without any, D = 0)."""
    rows = torch.zeros(len(offline_emb), n)
    for g, offline in enumerate(offline_emb):
        if offline is not None:
            rows[g] = divergence(online_emb[g * n : (g + 1) * n], offline)[1]
    return rows


def teacher_response(text: str, tokenizer, max_tokens: int, prefill: str = "") -> tuple[str, list[int], str]:
    """A teacher text as the policy would continue the prompt: the prompt's prefill stripped from its
    start (`strip_prefill`), as text and as policy tokens with EOS cut at the response cap; and its
    finish reason."""
    text = strip_prefill(text, prefill)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return (text, ids[:max_tokens], "length") if len(ids) > max_tokens else (text, ids, "stop")


def splice(
    rollouts: RolloutBatch, teachers: dict[int, tuple[str, list[int], str]]
) -> tuple[RolloutBatch, torch.Tensor]:
    """The batch with row i's response replaced by teachers[i] (text, ids, finish reason), and
    offpolicy bool[B]. Teacher tokens take no ratio and no TIS: their behaviour log-probs are unused."""
    responses, logps = list(rollouts.response_ids), list(rollouts.behaviour_logprobs)
    texts, reasons = list(rollouts.texts), list(rollouts.finish_reasons)
    offpolicy = torch.zeros(len(texts), dtype=torch.bool)
    for row, (text, ids, reason) in teachers.items():
        texts[row], responses[row], reasons[row] = text, ids, reason
        logps[row] = [0.0] * len(ids)
        offpolicy[row] = True
    return replace(
        rollouts, response_ids=responses, behaviour_logprobs=logps, texts=texts, finish_reasons=reasons
    ), offpolicy


def mix_teachers(
    rollouts: RolloutBatch,
    keys: list[str],
    golds: list[str],
    verifiable: torch.Tensor,
    last_entropy: torch.Tensor,
    embeddings: tuple | None,
    *,
    preset: AlgorithmPreset,
    k: int,
    store: OfflineStore,
    score: ScoreFn,
    to_response: Callable[[str], tuple[str, list[int], str]],
    rng: np.random.Generator,
) -> HybridGroups:
    """Hybrid groups for one rank's batch. keys (the prompts' keys in `store`), golds: [P]; verifiable,
    last_entropy: [B = P * n]; embeddings: (online [B, d], {key: offline [M, d]}) when the preset needs
    them; to_response: a teacher text as a policy response (`teacher_response`)."""
    n, p = rollouts.n, len(keys)
    teachers = [store.for_prompt(key) for key in keys]
    with_data = torch.tensor([bool(t) for t in teachers], dtype=torch.bool)  # [P]
    d = None
    if embeddings is not None:
        online_emb, offline_emb = embeddings
        d = group_divergence(online_emb, [offline_emb[key] if t else None for key, t in zip(keys, teachers)], n)
    rewards, replaced, r_oger = hybrid_rewards(
        verifiable.view(p, n),
        last_entropy.view(p, n),
        d,
        k=k,
        refine=preset.refine,
        lowest_divergence=preset.replacement == "lowest_divergence",
        exploration=preset.exploration_reward,
    )
    drawn = {}  # row -> the teacher response in its place
    for g in with_data.nonzero().flatten().tolist():  # one draw per group, in order: a function of the rng
        picks = rng.choice(len(teachers[g]), size=k, replace=len(teachers[g]) < k)
        drawn |= {g * n + int(slot): to_response(teachers[g][int(pick)].text) for slot, pick in zip(replaced[g], picks)}
    hybrid, offpolicy = splice(rollouts, drawn)
    rewards = rewards.flatten()  # [B]
    if drawn:
        rows = offpolicy.nonzero().flatten().tolist()
        rewards[offpolicy] = score([hybrid.texts[i] for i in rows], [golds[i // n] for i in rows])
    scored = with_data.repeat_interleave(n) & (d is not None)  # [B] online members OGER scored
    divergence_all = d.flatten() if d is not None else torch.zeros(len(rewards))
    return HybridGroups(
        hybrid,
        rewards,
        offpolicy,
        _metric_sums(
            offpolicy,
            scored & ~offpolicy,
            verifiable,
            rewards,
            divergence_all,
            r_oger.flatten(),
            last_entropy,
            p - int(with_data.sum()),
        ),
    )


def _metric_sums(
    offpolicy, kept_scored, verifiable, rewards, divergence, exploration, last_entropy, no_offline: int
) -> dict[str, float]:
    """Per-rank sums over the online members that stay (OGER's) and the teacher members."""
    return {
        "replaced": float(offpolicy.sum()),
        "no_offline_groups": float(no_offline),
        "online": float((~offpolicy).sum()),
        "online_correct": float(verifiable[~offpolicy].sum()),
        "offline_correct": float(rewards[offpolicy].sum()),
        "oger_scored": float(kept_scored.sum()),
        "oger_divergence": float(divergence[kept_scored].sum()),
        "oger_entropy": float(last_entropy[kept_scored].sum()),
        "oger_exploration": float(exploration[kept_scored].sum()),
        "oger_exploration_max": float(exploration[kept_scored].max()) if kept_scored.any() else 0.0,
    }
