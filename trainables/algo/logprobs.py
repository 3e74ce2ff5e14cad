"""Per-token log-probs and entropy of a causal LM without full-vocabulary copies.

The learner needs, at each response position, log pi(y_t) and (for the entropy bonus, OGER's H and the
metric) the entropy of pi(. | y_<t). Computing logits [B, T, V] for a whole batch holds B T V floats
several times over (the logits, their fp32 copy, the log-softmax, the entropy's softmax, and all of
it again for backward): at V = 151,936 that is ~0.6 MB per token per copy. Here the vocabulary
dimension exists for at most `chunk_tokens` positions at a time, only at response positions, and in
training each chunk is checkpointed: its logits are recomputed in backward instead of stored, so what
stays alive per token is its hidden state and two floats.

Precision: each chunk's logits are upcast to float32 before the log-softmax (a chunk of them, not the
batch's), so the result is what the full fp32 computation gives, to float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from trainables.algo.losses import entropy_from_logits

ENTROPY_MODES = ("none", "value", "grad")  # not computed / detached (a metric, OGER's H) / in the graph (a loss term)


def _chunk(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor | None,
    entropy: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: hidden [n, H], targets long[n], temperature [n] or None -> (logp [n], entropy [n])."""
    logits = head(hidden).float()  # [n, V]
    if temperature is not None:
        logits = logits / temperature[:, None]
    logp = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)  # [n]
    if entropy == "none":
        return logp, torch.zeros_like(logp)
    if entropy == "value":
        with torch.no_grad():
            return logp, entropy_from_logits(logits)
    return logp, entropy_from_logits(logits)


def token_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: torch.Tensor | None = None,
    *,
    chunk_tokens: int = 1024,
    entropy: str = "value",
    min_chunks: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(y_t) = log softmax(head(h_t) / tau_t)[y_t] and H_t = -sum_v p_v log p_v at the masked positions.

    head: the LM head (hidden [n, H] -> logits [n, V]). hidden: [B, T, H], position t predicting
    targets[:, t] (long[B, T]). mask: bool[B, T], the positions wanted (elsewhere the outputs are 0).
    temperature: [B, T] or None (T = 1). chunk_tokens: positions per chunk, the only ones whose
    vocabulary row exists at a time. entropy: one of ENTROPY_MODES. min_chunks: calls of `head` to make at
    least, empty ones included (under ZeRO-3 each call gathers the head's weights, a collective that
    every rank must make as often).
    Returns (logp [B, T], entropy [B, T] or None), float32. With gradients enabled each chunk is
    checkpointed (its logits recomputed in backward).
    """
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    rows = mask.nonzero(as_tuple=True)  # the N wanted positions
    h, y = hidden[rows], targets[rows]  # [N, H], [N]
    tau = None if temperature is None else temperature[rows]  # [N]
    remat = torch.is_grad_enabled() and h.requires_grad
    logps, entropies = [], []
    for start in range(0, max(math.ceil(h.shape[0] / chunk_tokens), min_chunks) * chunk_tokens, chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (head, h[part], y[part], None if tau is None else tau[part], entropy)
        logp, ent = checkpoint(_chunk, *args, use_reentrant=False) if remat else _chunk(*args)
        logps.append(logp)
        entropies.append(ent)
    logp_out = hidden.new_zeros(mask.shape, dtype=torch.float32)  # [B, T]
    logp_out = logp_out.index_put(rows, torch.cat(logps)) if logps else logp_out
    if entropy == "none":
        return logp_out, None
    ent_out = hidden.new_zeros(mask.shape, dtype=torch.float32)  # [B, T]
    return logp_out, ent_out.index_put(rows, torch.cat(entropies)) if entropies else ent_out
