"""A step's metrics: each rank's sums in, the logged metrics out, and the watch on the values that
must stay finite. The caller reduces the sums over ranks between the two halves (`trainables.runtime.ranks`).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch

from trainables.algo.advantages import zero_std_fraction
from trainables.names import REASONS
from trainables.rollout.types import RolloutBatch
from trainables.runtime.errors import NonFiniteError

WATCHED = ("policy/grad_norm", "policy/entropy", "policy/kl", "rollout/reward_mean")  # finite at every step


@contextmanager
def timed(timings: dict[str, float], key: str):
    """Adds the block's wall seconds to timings[key] (a step's `timing/*`)."""
    start = time.perf_counter()
    yield
    timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def check_finite(metrics: dict[str, float], last_finite: dict[str, float], where: str) -> dict[str, float]:
    """The step's watched metrics, rounded, if all are finite (the next step's `last_finite`); else a
    NonFiniteError naming the step, what broke and the last finite step's values."""
    if bad := sorted(k for k in WATCHED if not math.isfinite(metrics[k])):
        raise NonFiniteError(
            f"{where}: {', '.join(bad)} not finite; the last finite step's: "
            f"{last_finite or 'none (the first step)'}; lower learner.lr or check the data"
        )
    return {k: round(metrics[k], 6) for k in ("progress/step", *WATCHED)}


def rank_sums(
    rollouts: RolloutBatch,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    grouped: torch.Tensor,
    reasons: dict[str, int],
    tis: torch.Tensor,
    stats: dict[str, float],
    tis_cap: float | None,
) -> dict[str, float]:
    """One rank's sums of a step. rollouts: the online batch; mask: bool[B, T] response tokens of the
    trained batch; rewards [B]; grouped [P, N]; tis [B, T]; stats: the learner update's."""
    capped = (tis >= tis_cap) if tis_cap else torch.zeros_like(mask)
    return {
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


def tis_max(tis: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest TIS weight [B, T] on a response token (1 without one)."""
    return float(tis[mask].max()) if mask.any() else 1.0


def step_metrics(
    s: dict[str, float],
    weight_max: float,
    stats: dict[str, float],
    timings: dict[str, float],
    *,
    step: int,
    optimizer_step: int,
    service_losses: int,
) -> dict[str, float]:
    """rollout/*, policy/*, tis/*, timing/*, progress/* of a step from the sums `s` over ranks; timings:
    rank 0's own phases (they add up to its step, which the sync barrier aligns with every rank's)."""
    tokens = max(s["tokens"], 1.0)
    return {
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
        "tis/weight_max": weight_max,
        "tis/capped_fraction": s["tis_capped"] / tokens,
        **{f"timing/{k}": v for k, v in sorted(timings.items())},
        "timing/tokens_per_s": s["length"] / max(timings["step"], 1e-9),
        "progress/step": step + 1,  # RL steps done: the time axis of Tune's schedulers
        "progress/optimizer_step": optimizer_step,
        "faults/service_losses": service_losses,
    }


def offline_metrics(s: dict[str, float], exploration_max: float, embeddings: bool) -> dict[str, float]:
    """offline/* (luffy, oger*) and oger/* (embeddings: oger*) from the hybrid groups' sums over ranks."""
    out = {
        "offline/replaced": s["replaced"],
        "offline/accuracy": s["offline_correct"] / max(s["replaced"], 1.0),
        "offline/groups_without_data": s["no_offline_groups"],
        "offline/advantage_mean": s["advantage_sum"] / max(s["replaced"], 1.0),
        "rollout/accuracy_online_kept": s["online_correct"] / max(s["online"], 1.0),
    }
    if embeddings:
        scored = max(s["oger_scored"], 1.0)
        out |= {
            "timing/encoder": s["encoder_seconds"],  # the encoder actor's busy time, every rank's texts
            "oger/divergence_mean": s["oger_divergence"] / scored,
            "oger/last_token_entropy_mean": s["oger_entropy"] / scored,
            "oger/exploration_mean": s["oger_exploration"] / scored,
            "oger/exploration_max": exploration_max,
        }
    return out
