"""OGER (Offline-Guided Exploration Reward) for one prompt: pure functions of tensors.

For the N online trajectories of a prompt and its M offline (teacher) trajectories, with embeddings
E_on [N, d] and E_off [M, d] from one encoder:

    s_ij = cos(E_on_i, E_off_j)                                    (OGER eq. 3)
    sim_i = (1 / M) sum_j s_ij                                       (eq. 4)
    D_i = 1 - sim_i                                                  (eq. 5)
    R_OGER_i = D_i * exp(-H_i) * R_m_i                               (eq. 7; H_i of eq. 6)
    R_i = R_m_i + R_OGER_i  online,   R_i = R_m_i  offline           (eq. 8)

Divergence-aware replacement (section 3.2): the k online trajectories of lowest D are replaced by k
offline ones, and the advantage is computed over the hybrid group (eq. 9).
"""

from __future__ import annotations

import torch

COSINE_EPS = 1e-8  # a zero embedding has cosine 0 with everything instead of NaN


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """OGER eq. 3: s_ij = a_i . b_j / (|a_i| |b_j|). a: [N, d], b: [M, d] -> [N, M].

    The inputs need not be normalised; norms are clamped at COSINE_EPS.
    """
    a_unit = a / a.norm(dim=-1, keepdim=True).clamp(min=COSINE_EPS)  # [N, d]
    b_unit = b / b.norm(dim=-1, keepdim=True).clamp(min=COSINE_EPS)  # [M, d]
    return a_unit @ b_unit.T  # [N, M]


def divergence(online_emb: torch.Tensor, offline_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OGER eq. 3-5: (sim_i = mean_j cos(E_on_i, E_off_j), D_i = 1 - sim_i), each [N], of online_emb
    [N, d] from offline_emb [M, d]."""
    similarity = cosine_matrix(online_emb.float(), offline_emb.float()).mean(dim=1)  # [N]
    return similarity, 1.0 - similarity


def exploration_reward(
    divergence: torch.Tensor, last_token_entropy: torch.Tensor, verifiable: torch.Tensor, *, refine: bool = True
) -> torch.Tensor:
    """OGER eq. 7: R_OGER = D * exp(-H) * R_m, elementwise over any shape (refine=False: D * R_m)."""
    exploration = divergence * verifiable.to(divergence.dtype)  # wrong answers get no exploration reward
    if refine:
        exploration = exploration * torch.exp(-last_token_entropy.to(divergence.dtype))
    return exploration


def replacement_indices(divergence: torch.Tensor, k: int) -> torch.Tensor:
    """OGER section 3.2: indices of the k online trajectories of lowest divergence D, to be replaced.

    divergence: [N]; 0 <= k < N (at least one online member stays). Ties go to the lower index.
    Returns long[k], ascending.
    """
    n = divergence.shape[0]
    if not 0 <= k < n:
        raise ValueError(f"replacement density k must be in [0, {n - 1}] for a group of {n}, got {k}")
    order = torch.sort(divergence, stable=True).indices  # [N], lowest D first, ties by index
    return order[:k].sort().values
