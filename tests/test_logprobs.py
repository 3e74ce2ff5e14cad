"""Log-probs and entropy one vocabulary chunk at a time equal the full computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from trainables.algo.logprobs import token_logprobs
from trainables.algo.losses import entropy_from_logits

B, T, H, V = 3, 7, 16, 50


def reference(head, hidden, targets, temperature):
    """The straightforward pass: full logits [B, T, V] in fp32, log-softmax, gather, entropy."""
    logits = head(hidden).float() / (1.0 if temperature is None else temperature[..., None])
    return logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1), entropy_from_logits(logits)


@pytest.fixture
def case():
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=gen))
    hidden = torch.randn(B, T, H, generator=gen, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.3
    temperature = 0.5 + torch.rand(B, T, generator=gen)
    return head, hidden, targets, mask, temperature


@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("tempered", [False, True])
def test_chunks_equal_the_full_pass_with_gradients(case, chunk, tempered):
    head, hidden, targets, mask, temperature = case
    temperature = temperature if tempered else None
    logp, entropy = token_logprobs(head, hidden, targets, mask, temperature, chunk_tokens=chunk, entropy="grad")
    ref_logp, ref_entropy = reference(head, hidden, targets, temperature)
    torch.testing.assert_close(logp[mask], ref_logp[mask])
    torch.testing.assert_close(entropy[mask], ref_entropy[mask])
    assert (logp[~mask] == 0).all() and (entropy[~mask] == 0).all()  # unwanted positions are never computed
    weights = torch.randn(B, T)
    grads = torch.autograd.grad(((logp + 0.3 * entropy) * weights).sum(), (hidden, head.weight))
    ref = torch.autograd.grad(
        (torch.where(mask, ref_logp + 0.3 * ref_entropy, 0) * weights).sum(), (hidden, head.weight)
    )
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got, want)


def test_entropy_graph_only_when_asked(case):
    head, hidden, targets, mask, _ = case
    logp, entropy = token_logprobs(head, hidden, targets, mask, chunk_tokens=4, entropy="value")
    assert logp.requires_grad and not entropy.requires_grad
    torch.testing.assert_close(entropy[mask], reference(head, hidden, targets, None)[1][mask].detach())
    logp, entropy = token_logprobs(head, hidden, targets, mask, chunk_tokens=4, entropy="none")
    assert entropy is None
    with torch.no_grad():
        logp, _ = token_logprobs(head, hidden, targets, mask, chunk_tokens=4)
    assert not logp.requires_grad
    with pytest.raises(ValueError, match="entropy must be one of"):
        token_logprobs(head, hidden, targets, mask, entropy="full")


def test_min_chunks_calls_the_head_as_often_as_the_busiest_rank():
    """Under ZeRO-3 every call of the head is a collective: a rank with fewer response tokens pads its
    calls with empty chunks, which change no output."""
    import torch

    from trainables.algo.logprobs import token_logprobs

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 11)
    calls = []

    def head(h):
        calls.append(h.shape[0])
        return linear(h)

    hidden, targets = torch.randn(2, 5, 8), torch.randint(0, 11, (2, 5))
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, :3] = mask[1, :2] = True  # 5 positions: 3 chunks of 2
    plain = token_logprobs(head, hidden, targets, mask, chunk_tokens=2)
    assert calls == [2, 2, 1]
    calls.clear()
    padded = token_logprobs(head, hidden, targets, mask, chunk_tokens=2, min_chunks=5)
    assert calls == [2, 2, 1, 0, 0]
    assert torch.equal(plain[0], padded[0]) and torch.equal(plain[1], padded[1])
