"""Token-level policy losses and their aggregation (GRPO/DAPO clip, LUFFY policy shaping, EAD TIS).

Conventions: token tensors are [B, T] (B sequences of T response positions), `mask` is bool[B, T],
True on the response tokens that count. The per-token functions return unmasked [B, T] values;
masking and normalisation happen once, in the aggregation.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trainables import names
from trainables.names import same_names

MAX_LOG_RATIO = 20.0  # log-ratios are clamped to +-20 (as verl) so exp() cannot overflow to inf/NaN grads


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast advantages [B] (one per sequence) or [B, T] to like's [B, T]."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1]
    if advantages.dim() != 2 or advantages.shape[0] != like.shape[0]:
        raise ValueError(
            f"advantages must be [B] or [B, T] with B = {like.shape[0]}, "
            f"got shape {tuple(advantages.shape)}; "
            "pass one advantage per sequence or one per token"
        )
    return advantages


def _token_log_weights(log_w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token TIS (the EAD official code): log w_t = logp_old_t - logp_behaviour_t. [B, T] -> [B, T]."""
    return log_w


def _sequence_log_weights(log_w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence TIS (the EAD paper's formula): log w_i = sum_t m_it (logp_old_it - logp_behaviour_it),
    the same weight on every token of row i. [B, T], bool[B, T] -> [B, T]."""
    return torch.where(mask, log_w, torch.zeros_like(log_w)).sum(dim=-1, keepdim=True).expand_as(log_w)


TIS_LEVELS = {"token": _token_log_weights, "sequence": _sequence_log_weights}  # rollout.tis_level
same_names(TIS_LEVELS, names.TIS_LEVELS, "TIS levels")


def tis_weights(
    logp_old: torch.Tensor,
    logp_behaviour: torch.Tensor,
    cap: float | None,
    *,
    mask: torch.Tensor | None = None,
    level: str = "token",
) -> torch.Tensor:
    """EAD truncated importance sampling weight: w = min(exp(logp_old - logp_behaviour), C).

    logp_old: [B, T], log pi_old(y_t) recomputed by the learner (at its log-prob temperature).
    logp_behaviour: [B, T], log-prob of y_t under the distribution actually sampled (annealed).
    cap: C; None turns TIS off (weights of one). level: a key of TIS_LEVELS, the ratio of each token
    ("token") or of the whole response, prod_t over mask bool[B, T] ("sequence"; mask required).
    Returns detached weights [B, T] (no gradient).
    """
    if cap is None:
        return torch.ones_like(logp_old).detach()
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level {level!r}; choose one of {sorted(TIS_LEVELS)}")
    mask = torch.ones_like(logp_old, dtype=torch.bool) if mask is None else mask
    _check_mask(logp_old, mask)
    log_w = TIS_LEVELS[level]((logp_old - logp_behaviour).detach(), mask)  # [B, T]
    return torch.exp(log_w.clamp(max=MAX_LOG_RATIO)).clamp(max=cap)


def ppo_token_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float | None,
    clip_high: float | None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with DAPO clip-higher and optional dual-clip, per token.

    l_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high)),  r_t = exp(logp_t - logp_old_t);
    with dual-clip (Ye et al. 2020, verl's clip_ratio_c) and A < 0: l_t = min(l_t, -A c).
    logp, logp_old: [B, T]. advantages: [B] (broadcast over tokens) or [B, T].
    clip_low / clip_high: eps_low / eps_high; None removes that side of the clip, both None is
    LUFFY's `loss_remove_clip` (l_t = -A r_t). dual_clip: c > 1, or None (off). The log-ratio is
    clamped to +-MAX_LOG_RATIO.
    Returns (loss [B, T], clipped bool[B, T]: True where the clipped branch is the active one,
    i.e. where the token gets no gradient).
    """
    adv = _per_token(advantages, logp)  # [B, 1] or [B, T]
    ratio = torch.exp((logp - logp_old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # [B, T]
    loss, clipped = -adv * ratio, torch.zeros_like(ratio, dtype=torch.bool)  # [B, T]
    if clip_low is not None or clip_high is not None:
        low = None if clip_low is None else 1.0 - clip_low
        high = None if clip_high is None else 1.0 + clip_high
        loss_clipped = -adv * torch.clamp(ratio, min=low, max=high)  # [B, T]
        clipped = loss_clipped > loss  # [B, T]; strict: inside the band the unclipped term is active
        loss = torch.where(clipped, loss_clipped, loss)
    if dual_clip is not None:
        floor = (-adv * dual_clip).expand_as(loss)  # [B, T]; binds only where A < 0 and r_t > c
        dual = (adv < 0) & (loss > floor)  # [B, T]
        loss, clipped = torch.where(dual, floor, loss), clipped | dual
    return loss, clipped


def policy_shaping_loss(logp: torch.Tensor, advantages: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """LUFFY off-policy token loss with policy shaping: l_t = -A f(p_t), f(p) = p / (p + gamma).

    p_t = exp(logp_t) = pi_theta(y_t) of a teacher token; the teacher probability is taken as 1,
    so there is no importance ratio and no clip. logp: [B, T]; advantages: [B] or [B, T].
    Returns loss [B, T]; d l_t / d logp_t = -A gamma p_t / (p_t + gamma)^2.
    """
    adv = _per_token(advantages, logp)  # [B, 1] or [B, T]
    p = torch.exp(logp)  # [B, T]
    return -adv * p / (p + gamma)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits): H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v.

    Computed on z - max(z), which leaves H unchanged but avoids the cancellation of two large
    numbers (logits of 1e4 in float32). OGER eq. 6 takes it at the last position.
    logits: [..., V], finite. Returns [...].
    """
    z = logits - logits.amax(dim=-1, keepdim=True).detach()  # [..., V], max 0
    p = torch.softmax(z, dim=-1)  # [..., V]
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(d) - d - 1, d = logp_ref - logp (>= 0).

    logp, logp_ref: [B, T]. Returns [B, T]; d is clamped to +-MAX_LOG_RATIO.
    """
    d = (logp_ref - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    return torch.exp(d) - d - 1.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values [B, T] over mask bool[B, T] (a metric: clip fraction, mean TIS weight).

    Returns a scalar tensor; 0 when the mask is empty.
    """
    _check_mask(values, mask)
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp(min=1)


# ---------------------------------------------------------------- aggregation -------------------
# Each mode returns the SUM over the given micro-batch divided by a GLOBAL normaliser (counted over
# the whole optimizer batch: every micro-batch on every data-parallel rank), so that summing the
# results of all micro-batches gives the loss of the whole batch, however it is split.


def _check_mask(values: torch.Tensor, mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool or mask.shape != values.shape:
        raise ValueError(
            f"mask must be bool with the shape of values {tuple(values.shape)}, got {mask.dtype} "
            f"{tuple(mask.shape)}; pass the response mask as mask.bool()"
        )


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values [B, T] with the masked-out positions set to 0 (NaN/inf there cannot leak)."""
    _check_mask(values, mask)
    return torch.where(mask, values, torch.zeros_like(values))


class Aggregation(Protocol):
    """values [B, T], mask bool[B, T], global normalisers -> scalar micro-batch share of the loss."""

    def __call__(self, values: torch.Tensor, mask: torch.Tensor, *, num_tokens, num_seqs, norm_len) -> torch.Tensor: ...


def token_mean(values, mask, *, num_tokens, num_seqs, norm_len):
    """token-mean: sum_{i,t} v_it m_it / num_tokens (num_tokens: global count of True in mask)."""
    return _masked(values, mask).sum() / num_tokens


def seq_mean_token_sum(values, mask, *, num_tokens, num_seqs, norm_len):
    """seq-mean-token-sum: sum_i (sum_t v_it m_it) / num_seqs (num_seqs: global sequence count)."""
    return _masked(values, mask).sum(dim=-1).sum() / num_seqs


def seq_mean_token_mean(values, mask, *, num_tokens, num_seqs, norm_len):
    """seq-mean-token-mean: sum_i (sum_t v_it m_it / sum_t m_it) / num_seqs; an empty row adds 0."""
    seq_sums = _masked(values, mask).sum(dim=-1)  # [B]
    seq_lens = mask.sum(dim=-1).clamp(min=1)  # [B]; an empty row has sum 0, so any length > 0 works
    return (seq_sums / seq_lens).sum() / num_seqs


def seq_mean_token_sum_norm(values, mask, *, num_tokens, num_seqs, norm_len):
    """seq-mean-token-sum-norm (Dr.GRPO, LUFFY's constant normaliser): sum v m / (num_seqs norm_len)."""
    return _masked(values, mask).sum() / (num_seqs * norm_len)


AGGREGATIONS: dict[str, Aggregation] = {
    "token-mean": token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
same_names(AGGREGATIONS, names.AGGREGATIONS, "loss aggregations")


def aggregate_loss(
    mode: str, values: torch.Tensor, mask: torch.Tensor, *, num_tokens, num_seqs, norm_len
) -> torch.Tensor:
    """Aggregate per-token values [B, T] over mask bool[B, T] with the `AGGREGATIONS[mode]` rule.

    num_tokens: global count of response tokens (True in the mask) over the whole optimizer batch.
    num_seqs: global count of sequences over the whole optimizer batch (rows with an empty mask
    contribute 0 to every sum, so count them or not as the normaliser you want).
    norm_len: the constant length normaliser of seq-mean-token-sum-norm.
    Numbers or 0-d tensors; a tensor normaliser is not checked (that would need a device sync).
    Returns a scalar: this micro-batch's share, so the shares of all micro-batches and ranks sum
    to the batch loss (an engine that averages gradients over ranks or divides by the number of
    accumulation steps must be compensated by the caller).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    for name, value in (("num_tokens", num_tokens), ("num_seqs", num_seqs), ("norm_len", norm_len)):
        if isinstance(value, (int, float)) and value <= 0:
            raise ValueError(f"{name} must be > 0 (got {value}); count it over the whole optimizer batch")
    return AGGREGATIONS[mode](values, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=norm_len)


# ---------------------------------------------------------------- the objective -----------------
STAT_KEYS = ("pg_loss", "entropy", "clipped", "kl", "offpolicy")  # per-token sums `policy_objective` returns


def policy_objective(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    tis: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
    clip_low: float | None,
    clip_high: float | None,
    dual_clip: float | None,
    shaping_gamma: float,
    entropy_coef: float,
    kl_coef: float,
    loss_agg: str,
    num_tokens,
    num_seqs,
    norm_len,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of a micro-batch: GRPO/DAPO's clipped ratio weighted by TIS on online rows, LUFFY's
    shaped loss on teacher rows, an entropy bonus and a k3 KL, each aggregated by `loss_agg`.

        l_t = w_t PPO_t(r_t, A)     online rows (w_t: TIS weight, r_t = pi / pi_old)
        l_t = -A f(p_t)             teacher rows (LUFFY; f(p) = p / (p + gamma), no ratio, clip or TIS)
        L   = agg(l) - c_H agg(H) + c_KL agg(k3(pi, pi_ref))

    logp, logp_old, tis: [B, T]; advantages: [B] or [B, T]; teacher: bool[B] (teacher rows); mask:
    bool[B, T]; entropy: [B, T] (needed, with its graph, when entropy_coef > 0; else a metric or None);
    logp_ref: [B, T] or None (no KL term). num_tokens, num_seqs, norm_len: the global normalisers of
    `aggregate_loss`. Returns (loss scalar, {key: sum over mask} for key in STAT_KEYS, 0-d tensors,
    detached: the caller syncs them once per step).
    """
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef > 0 needs the entropy [B, T] with its graph; pass entropy=")
    pg, clipped = ppo_token_loss(
        logp, logp_old, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    rows = teacher[:, None].expand_as(pg)  # bool[B, T]
    shaped = policy_shaping_loss(logp, advantages, gamma=shaping_gamma)
    pg, clipped = torch.where(rows, shaped, pg * tis), clipped & ~rows
    norm = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_len": norm_len}
    loss = aggregate_loss(loss_agg, pg, mask, **norm)
    if entropy_coef:
        loss = loss - entropy_coef * aggregate_loss(loss_agg, entropy, mask, **norm)
    kl = torch.zeros_like(logp) if logp_ref is None else kl_k3(logp, logp_ref)  # [B, T]
    if logp_ref is not None:
        loss = loss + kl_coef * aggregate_loss(loss_agg, kl, mask, **norm)
    per_token = {
        "pg_loss": pg,
        "entropy": torch.zeros_like(logp) if entropy is None else entropy,
        "clipped": clipped.float(),
        "kl": kl,
        "offpolicy": rows.float(),
    }
    return loss, {key: _masked(value.detach(), mask).sum() for key, value in per_token.items()}
