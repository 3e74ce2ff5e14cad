"""Per-token temperature schedules: Exploratory Annealed Decoding (EAD) and a fixed temperature.

EAD (Exploratory Annealed Decoding): explore early in a response, exploit late. For the generated
token at index t (t = 0 is the first new token) at RL step s (the rollout round, counting from 1 at
the first rollout, as the official trainer's `global_steps`; not the optimizer step, of which a round
makes `learner.minibatches`):

    d_s   = min(d_0 + 5 s, 40000)                                   (global-step-aware decay)
    tau_t = max(1 + tau_max - exp(t / (S d_s)), tau_min)   for t >= c
    tau_t = 1                                              for t <  c   (c = warm-up tokens)

The paper's formula has no S; the official code divides by S = 20, so with the recipe defaults
(tau_max 1.2, tau_min 0.1, d_0 25) the floor tau_min is reached after ~371 tokens instead of ~19.
`time_scale=1.0` gives the paper's formula. The temperature divides the logits on top of the
engine's own temperature, which stays 1.0.

Validation of the parameters (tau_min <= tau_max, ...) lives in the config layer, not here.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import torch

from trainables import names
from trainables.names import same_names

DECAY_PER_STEP = 5  # d_s grows by 5 per RL step (EAD official code)
MAX_DECAY = 40000  # cap of d_s
MAX_EXP_ARG = 700.0  # exp(700) ~ 1e304 is finite in float64; beyond, tau_t is the floor anyway


def ead_decay(step: int, *, d0: float) -> float:
    """EAD global-step-aware decay: d_s = min(d_0 + 5 s, 40000).

    step: s, the RL step (the rollout round, 1 at the first rollout). d0: d_0, the decay at s = 0.
    """
    return min(d0 + DECAY_PER_STEP * step, MAX_DECAY)


def ead_temperature(
    t: int,
    step: int,
    *,
    tau_max: float,
    tau_min: float,
    d0: float,
    warmup_tokens: int = 10,
    time_scale: float = 20.0,
) -> float:
    """EAD temperature of one token: tau_t = max(1 + tau_max - exp(t / (S d_s)), tau_min) for t >= c.

    t: index of the generated token, from 0. step: s, the RL step (1 at the first rollout).
    warmup_tokens: c; tokens t < c are decoded at tau = 1. time_scale: S (absent from the paper,
    20 in the official code; 1.0 reproduces the paper's formula). A huge t gives tau_min, never an
    OverflowError.
    """
    if t < warmup_tokens:
        return 1.0
    exponent = min(t / (time_scale * ead_decay(step, d0=d0)), MAX_EXP_ARG)
    return max(1.0 + tau_max - math.exp(exponent), tau_min)


def ead_temperatures(
    positions: torch.Tensor,
    step: int,
    *,
    tau_max: float,
    tau_min: float,
    d0: float,
    warmup_tokens: int = 10,
    time_scale: float = 20.0,
) -> torch.Tensor:
    """Vectorised `ead_temperature` (EAD, tau_t above) for a logits processor.

    positions: long[B], the index t of the token each row generates next (0 = first new token).
    Returns float32[B] temperatures on positions' device, equal elementwise to `ead_temperature`.
    """
    t = positions.to(torch.float64)  # [B]; float64 so the values match the Python-float form
    exponent = (t / (time_scale * ead_decay(step, d0=d0))).clamp(max=MAX_EXP_ARG)  # [B]
    annealed = (1.0 + tau_max - torch.exp(exponent)).clamp(min=tau_min)  # [B]
    tau = torch.where(positions < warmup_tokens, torch.ones_like(annealed), annealed)  # [B]
    return tau.to(torch.float32)


def fixed_temperature(t: int, step: int, *, temperature: float) -> float:
    """Constant schedule: tau_t = temperature for every token t and step s (plain sampling)."""
    return float(temperature)


def fixed_temperatures(positions: torch.Tensor, step: int, *, temperature: float) -> torch.Tensor:
    """Vectorised `fixed_temperature`: positions long[B] -> float32[B], all equal to temperature."""
    return torch.full(positions.shape, float(temperature), dtype=torch.float32, device=positions.device)


class TemperatureSchedule(Protocol):
    """One signature for every schedule: positions long[B], step s, schedule params -> float32[B]."""

    def __call__(self, positions: torch.Tensor, step: int, **params: float) -> torch.Tensor: ...


# rollout.decoding.schedule -> tau_t; what the config asks of each is in trainables.names.SCHEDULES.
SCHEDULES: dict[str, TemperatureSchedule] = {
    "ead": ead_temperatures,  # EAD: the learner at T = 1, truncated importance sampling correcting the annealed sampler
    "fixed": fixed_temperatures,  # a fixed T: on-policy when the learner divides its logits by the same T
}
same_names(SCHEDULES, names.SCHEDULES, "temperature schedules")


def tau_table(schedule: str, params: dict[str, float], step: int, max_tokens: int) -> tuple[float, ...]:
    """tau_t of one schedule at every position a response of max_tokens samples at, t = 0 .. max_tokens - 1.

    Computed once per (schedule, params, step, cap) and shared, so an engine's decode step is a
    lookup, whatever the schedule.
    """
    return _tau_table(schedule, tuple(sorted(params.items())), step, max_tokens)


@functools.lru_cache(maxsize=64)
def _tau_table(schedule: str, params: tuple[tuple[str, float], ...], step: int, max_tokens: int) -> tuple[float, ...]:
    positions = torch.arange(max(max_tokens, 1), dtype=torch.long)  # [max_tokens]
    return tuple(SCHEDULES[schedule](positions, step, **dict(params)).tolist())
