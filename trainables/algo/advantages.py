"""Group-relative advantages (GRPO / OGER eq. 9) and the group metrics around them."""

from __future__ import annotations

import torch

GROUP_EPS = 1e-6  # keeps the std division finite; equal-reward groups are zeroed explicitly anyway


def _equal_groups(rewards: torch.Tensor) -> torch.Tensor:
    """bool[G]: True where every reward of the group equals the group's first one."""
    return (rewards == rewards[:, :1]).all(dim=-1)


def _check_groups(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape[1] == 0:
        raise ValueError(
            f"rewards must be [G, N] (groups x rollouts per prompt), got shape {tuple(rewards.shape)}; "
            "reshape the flat rewards with rewards.view(num_prompts, group_size)"
        )


def group_advantages(rewards: torch.Tensor, *, use_std: bool, eps: float = GROUP_EPS) -> torch.Tensor:
    """GRPO group advantage (OGER eq. 9): A_i = (R_i - mean_group(R)) / (std_group(R) + eps).

    rewards: [G, N], G groups (prompts) of N rollouts (offline slots included: they are full
    members of the group). Returns advantages [G, N] in rewards' dtype.
    use_std=False gives A_i = R_i - mean_group(R) (LUFFY's reference run, `grpo_use_std=False`).
    The std is torch's default, the unbiased one (divides by N - 1), as verl and TRL's `std()`.
    Groups whose rewards are all equal (and groups of one) get exactly 0, not a rounding residue
    or the NaN of a one-sample unbiased std.
    """
    _check_groups(rewards)
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # [G, N]
    if use_std and rewards.shape[1] > 1:  # a group of one has no std (and is zeroed below)
        centred = centred / (rewards.std(dim=-1, keepdim=True) + eps)  # [G, N]
    return torch.where(_equal_groups(rewards)[:, None], torch.zeros_like(centred), centred)


def zero_std_fraction(rewards: torch.Tensor) -> torch.Tensor:
    """Fraction of groups whose rewards are all equal (their advantages are 0: no signal).

    rewards: [G, N]. Returns a float scalar tensor in [0, 1] (metric `rollout/frac_zero_std`).
    """
    _check_groups(rewards)
    return _equal_groups(rewards).float().mean()
