"""Token losses (PPO clip-higher, LUFFY policy shaping, TIS, entropy, k3) and loss aggregation."""

import math

import pytest
import torch

from trainables.algo.losses import (
    AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    kl_k3,
    masked_mean,
    policy_objective,
    policy_shaping_loss,
    ppo_token_loss,
    tis_weights,
)

LOGP_OLD = math.log(0.5)


def _logp_at(ratios):
    """logp [1, K] with exp(logp - LOGP_OLD) = ratios, a leaf that takes gradients."""
    logp = (torch.log(torch.tensor([ratios], dtype=torch.float64)) + LOGP_OLD).requires_grad_()
    return logp, torch.full_like(logp, LOGP_OLD)


def _loss_and_grad(ratios, advantage, clip_low, clip_high):
    logp, logp_old = _logp_at(ratios)
    loss, clipped = ppo_token_loss(
        logp, logp_old, torch.tensor([advantage], dtype=torch.float64), clip_low=clip_low, clip_high=clip_high
    )
    loss.sum().backward()
    return loss.detach()[0], clipped[0], logp.grad[0]


# ---------------------------------------------------------------- PPO clip ----------------------


def test_positive_advantage_clipped_above_one_plus_high():
    ratios = [0.5, 0.9, 1.0, 1.1, 1.27, 1.29, 2.0]
    loss, clipped, grad = _loss_and_grad(ratios, 2.0, 0.2, 0.28)
    assert clipped.tolist() == [False, False, False, False, False, True, True]
    expected = [-2.0 * r for r in ratios[:5]] + [-2.0 * 1.28] * 2
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert torch.all(grad[clipped] == 0)
    # d(-A r)/d logp = -A r inside the band and below it (A > 0 keeps pushing low ratios up)
    inside = torch.tensor([-2.0 * r for r in ratios[:5]], dtype=torch.float64)
    torch.testing.assert_close(grad[~clipped], inside)


def test_negative_advantage_clipped_below_one_minus_low():
    ratios = [0.5, 0.79, 0.81, 1.0, 1.5]
    loss, clipped, grad = _loss_and_grad(ratios, -1.0, 0.2, 0.28)
    assert clipped.tolist() == [True, True, False, False, False]
    torch.testing.assert_close(loss, torch.tensor([0.8, 0.8, 0.81, 1.0, 1.5], dtype=torch.float64))
    assert torch.all(grad[clipped] == 0)
    assert torch.all(grad[~clipped] != 0)


def test_asymmetric_bounds_honoured():
    # eps_low 0.1, eps_high 0.5: 1.4 is inside for A > 0, 0.85 is outside for A < 0
    _, clipped_pos, _ = _loss_and_grad([1.4, 1.6], 1.0, 0.1, 0.5)
    _, clipped_neg, _ = _loss_and_grad([0.85, 0.95], -1.0, 0.1, 0.5)
    assert clipped_pos.tolist() == [False, True]
    assert clipped_neg.tolist() == [True, False]


def test_one_sided_clip():
    _, clipped, _ = _loss_and_grad([5.0], 1.0, 0.2, None)  # no upper bound
    assert clipped.tolist() == [False]
    _, clipped, _ = _loss_and_grad([0.1], -1.0, 0.2, None)
    assert clipped.tolist() == [True]


def test_no_clip_is_plain_ratio_term():
    ratios = [0.1, 1.0, 3.0]
    loss, clipped, grad = _loss_and_grad(ratios, 1.5, None, None)
    expected = torch.tensor([-1.5 * r for r in ratios], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected)
    assert not clipped.any()


def test_per_token_advantages_and_bad_shape():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0], [0.0, 3.0, -2.0]])
    loss, _ = ppo_token_loss(logp, logp, adv, clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, -adv)
    with pytest.raises(ValueError, match="one advantage per sequence"):
        ppo_token_loss(logp, logp, torch.ones(3), clip_low=0.2, clip_high=0.2)


def test_huge_ratio_gives_finite_gradient():
    logp = torch.tensor([[100.0]], requires_grad=True)
    loss, clipped = ppo_token_loss(logp, torch.zeros(1, 1), torch.ones(1), clip_low=0.2, clip_high=0.28)
    loss.sum().backward()
    assert clipped.all() and torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------- TIS ---------------------------


def test_tis_weights_capped_and_detached():
    logp_old = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    logp_beh = torch.tensor([[0.0, 0.5, -0.5, -1.0, -50.0]])  # exp(diff) = 1, 0.61, 1.65, 2.72, huge
    w = tis_weights(logp_old, logp_beh, 2.0)
    assert not w.requires_grad
    assert torch.all(w <= 2.0)
    torch.testing.assert_close(w[0, :3], torch.exp(-logp_beh[0, :3]))
    assert w[0, 3:].tolist() == [2.0, 2.0]
    off = tis_weights(logp_old, logp_beh, None)
    assert torch.equal(off, torch.ones(1, 5)) and not off.requires_grad


def test_sequence_tis_is_the_ratio_of_the_whole_response():
    """EAD's formula: w_i = min(prod_t pi_old / pi_beh, C) over the response, the same on every token."""
    logp_old = torch.zeros(2, 4)
    logp_beh = torch.tensor(
        [
            [-0.1, -0.2, 0.1, -9.0],  # log-ratio 0.1 + 0.2 - 0.1 = 0.2 (column 3 masked)
            [-0.5, -0.5, -0.5, -0.5],
        ]
    )  # 2.0 -> capped at 3
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    w = tis_weights(logp_old, logp_beh, 3.0, mask=mask, level="sequence")
    torch.testing.assert_close(w[0], torch.full((4,), math.exp(0.2)))
    assert w[1].tolist() == [3.0] * 4
    token = tis_weights(logp_old, logp_beh, 3.0, mask=mask, level="token")
    torch.testing.assert_close(token[0, :3], torch.exp(-logp_beh[0, :3]))
    with pytest.raises(ValueError, match="unknown TIS level"):
        tis_weights(logp_old, logp_beh, 3.0, mask=mask, level="row")


def test_dual_clip_bounds_negative_advantage_losses():
    """verl's dual-clip: with A < 0 and r > c the loss is -A c and the token takes no gradient; A > 0 and
    ratios under c are untouched."""
    logp, logp_old = _logp_at([0.5, 2.0, 5.0])
    loss, clipped = ppo_token_loss(
        logp, logp_old, torch.tensor([-1.0], dtype=torch.float64), clip_low=0.2, clip_high=0.28, dual_clip=3.0
    )
    assert loss.detach()[0].tolist() == pytest.approx([0.8, 2.0, 3.0])  # max(-A r, -A clip(r)), then min(., 3)
    assert clipped.tolist() == [[True, False, True]]
    loss.sum().backward()
    assert logp.grad[0, 2] == 0 and logp.grad[0, 1] != 0
    plain, _ = ppo_token_loss(
        logp.detach(), logp_old, torch.tensor([-1.0], dtype=torch.float64), clip_low=0.2, clip_high=0.28
    )
    assert plain[0].tolist() == pytest.approx([0.8, 2.0, 5.0])
    positive, _ = ppo_token_loss(
        logp.detach(), logp_old, torch.tensor([1.0], dtype=torch.float64), clip_low=0.2, clip_high=0.28, dual_clip=3.0
    )
    assert positive[0].tolist() == pytest.approx([-0.5, -1.28, -1.28])


# ---------------------------------------------------------------- policy shaping ----------------


def test_policy_shaping_values_and_ratio_free_gradient():
    p = torch.tensor([[0.01, 0.1, 0.5, 0.9, 1.0]], dtype=torch.float64)
    logp = torch.log(p).requires_grad_()
    gamma, adv = 0.1, torch.tensor([2.0], dtype=torch.float64)
    loss = policy_shaping_loss(logp, adv, gamma=gamma)
    torch.testing.assert_close(loss, -2.0 * p / (p + gamma))
    assert loss[0, 1].item() == pytest.approx(-1.0)  # p = gamma: f = 1/2
    loss.sum().backward()
    # d(-A p/(p+g))/d logp = -A g p / (p + g)^2: depends on p alone, no old policy, no ratio
    torch.testing.assert_close(logp.grad, -2.0 * gamma * p / (p + gamma) ** 2)


# ---------------------------------------------------------------- entropy, KL -------------------


def test_entropy_uniform_is_log_v_and_stable():
    for v in (2, 7, 151936):
        assert entropy_from_logits(torch.full((v,), 3.0)).item() == pytest.approx(math.log(v), rel=1e-5)
    big = torch.tensor([[1e4, 1e4, -1e4], [0.0, 0.0, 0.0]])  # [2, V=3]
    h = entropy_from_logits(big)
    torch.testing.assert_close(h, torch.tensor([math.log(2), math.log(3)]))
    one_hot = entropy_from_logits(torch.tensor([50.0, 0.0, 0.0]))
    assert 0 <= one_hot.item() < 1e-18


def test_entropy_matches_reference():
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0))  # [B, T, V]
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def test_k3_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(4, 9, generator=g) * 5, -torch.rand(4, 9, generator=g) * 5
    assert torch.all(kl_k3(logp, ref) >= 0)
    assert torch.equal(kl_k3(logp, logp), torch.zeros(4, 9))
    d = math.log(0.5) - math.log(0.25)
    assert kl_k3(torch.tensor([[math.log(0.25)]]), torch.tensor([[math.log(0.5)]])).item() == pytest.approx(
        math.exp(d) - d - 1
    )


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_mean(values, mask).item() == pytest.approx(7 / 3)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------- aggregation -------------------

B, T, D, V = 8, 12, 5, 7
LENGTHS = [12, 5, 9, 0, 12, 3, 7, 1]  # ragged, row 3 empty


def _batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]  # bool[B, T]
    w0 = torch.randn(D, V, generator=g, dtype=torch.float64)
    w_old = w0 + 0.3 * torch.randn(D, V, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return x, tokens, mask, w0, w_old, adv


def _logp(x, tokens, w):
    return torch.log_softmax(x @ w, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)  # [b, T]


def _micro_loss(mode, x, tokens, mask, w, w_old, adv, num_tokens, num_seqs):
    logp = _logp(x, tokens, w)
    logp_old = _logp(x, tokens, w_old)
    pg, _ = ppo_token_loss(logp, logp_old, adv, clip_low=0.2, clip_high=0.28)
    values = pg * tis_weights(logp_old, logp_old - 0.2, 1.1) + 0.05 * kl_k3(logp, logp_old)  # [b, T]
    return aggregate_loss(mode, values, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=T)


SPLITS = {"1x8": [8], "4x2": [2, 2, 2, 2], "ragged 3+1+4": [3, 1, 4], "2 ranks x 2 micro": [2, 2, 2, 2]}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_micro_batch_invariance(mode, split):
    x, tokens, mask, w0, w_old, adv = _batch()
    num_tokens, num_seqs = mask.sum(), B  # global counts over the whole optimizer batch

    w_full = w0.clone().requires_grad_()
    full = _micro_loss(mode, x, tokens, mask, w_full, w_old, adv, num_tokens, num_seqs)
    full.backward()

    w_acc = w0.clone().requires_grad_()  # gradients accumulate over micro-batches (and sum over ranks)
    total, start = torch.zeros((), dtype=torch.float64), 0
    for size in SPLITS[split]:
        rows = slice(start, start + size)
        part = _micro_loss(mode, x[rows], tokens[rows], mask[rows], w_acc, w_old, adv[rows], num_tokens, num_seqs)
        part.backward()
        total, start = total + part.detach(), start + size

    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(w_acc.grad, w_full.grad)
    assert w_full.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_masked_tokens_change_nothing(mode):
    x, tokens, mask, w0, w_old, adv = _batch()
    x_noisy = torch.where(mask[..., None], x, torch.full_like(x, 1e3))
    grads, losses = [], []
    for inputs in (x, x_noisy):
        w = w0.clone().requires_grad_()
        loss = _micro_loss(mode, inputs, tokens, mask, w, w_old, adv, mask.sum(), B)
        loss.backward()
        losses.append(loss.detach())
        grads.append(w.grad)
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_aggregation_hand_worked():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    kw = dict(num_tokens=4, num_seqs=3, norm_len=10)
    assert aggregate_loss("token-mean", values, mask, **kw).item() == pytest.approx(10 / 4)
    assert aggregate_loss("seq-mean-token-sum", values, mask, **kw).item() == pytest.approx(10 / 3)
    assert aggregate_loss("seq-mean-token-mean", values, mask, **kw).item() == pytest.approx((2 + 4 + 0) / 3)
    assert aggregate_loss("seq-mean-token-sum-norm", values, mask, **kw).item() == pytest.approx(10 / 30)


def test_unknown_mode_lists_registry_names():
    values, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError) as err:
        aggregate_loss("mean", values, mask, num_tokens=2, num_seqs=1, norm_len=2)
    assert all(name in str(err.value) for name in AGGREGATIONS)


def test_bad_mask_and_normaliser_raise_with_the_fix():
    values = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"mask.bool\(\)"):
        aggregate_loss("token-mean", values, torch.ones(1, 2), num_tokens=2, num_seqs=1, norm_len=2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="num_tokens must be > 0"):
        aggregate_loss("token-mean", values, mask, num_tokens=0, num_seqs=1, norm_len=2)


# ---------------------------------------------------------------- the objective -----------------
def _objective_inputs():
    gen = torch.Generator().manual_seed(3)
    logp = (torch.rand(3, 4, generator=gen, dtype=torch.float64).log() - 0.1).requires_grad_()
    logp_old = logp.detach() + 0.2 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True], [True, False, False, False]])
    return {
        "logp": logp,
        "logp_old": logp_old,
        "advantages": torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64),
        "tis": torch.tensor([[1.0, 2.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64),
        "teacher": torch.tensor([False, False, True]),
        "mask": mask,
    }


COEFFS = dict(
    clip_low=0.2,
    clip_high=0.28,
    dual_clip=None,
    shaping_gamma=0.1,
    loss_agg="token-mean",
    num_tokens=7,
    num_seqs=3,
    norm_len=4,
)


def test_objective_is_its_terms():
    """L = agg(TIS x PPO on online rows, shaped loss on teacher rows) - c_H agg(H) + c_KL agg(k3)."""
    x = _objective_inputs()
    entropy = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    logp_ref = x["logp"].detach() - 0.1
    loss, stats = policy_objective(**x, entropy=entropy, logp_ref=logp_ref, entropy_coef=0.01, kl_coef=0.05, **COEFFS)
    pg, clipped = ppo_token_loss(x["logp"], x["logp_old"], x["advantages"], clip_low=0.2, clip_high=0.28)
    pg = torch.where(x["teacher"][:, None], policy_shaping_loss(x["logp"], x["advantages"], gamma=0.1), pg * x["tis"])
    norm = {"num_tokens": 7, "num_seqs": 3, "norm_len": 4}
    expected = (
        aggregate_loss("token-mean", pg, x["mask"], **norm)
        - 0.01 * aggregate_loss("token-mean", entropy, x["mask"], **norm)
        + 0.05 * aggregate_loss("token-mean", kl_k3(x["logp"], logp_ref), x["mask"], **norm)
    )
    torch.testing.assert_close(loss, expected)
    assert stats["offpolicy"].item() == 1.0  # the teacher row has one response token
    assert stats["clipped"].item() == float((clipped & ~x["teacher"][:, None] & x["mask"]).sum())
    torch.testing.assert_close(stats["pg_loss"], torch.where(x["mask"], pg, 0).sum().detach())
    assert all(not value.requires_grad and value.dim() == 0 for value in stats.values())
    loss.backward()
    torch.testing.assert_close(entropy.grad[x["mask"]], torch.full((7,), -0.01 / 7, dtype=torch.float64))


def test_objective_hand_worked():
    """Two tokens of one online row, A = 1, ratios 1.5 (clipped at 1.28) and 0.9, TIS 1: token-mean of
    -1.28 and -0.9; a teacher token with p = 0.1, A = 1: -0.1 / 0.2 = -0.5."""
    logp_old = torch.log(torch.tensor([[0.2, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.3, 0.45]], dtype=torch.float64))
    kw = {**COEFFS, "num_tokens": 2, "num_seqs": 1, "entropy_coef": 0.0, "kl_coef": 0.0}
    loss, stats = policy_objective(
        logp,
        logp_old,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2),
        torch.tensor([False]),
        torch.ones(1, 2, dtype=torch.bool),
        **kw,
    )
    assert loss.item() == pytest.approx((-1.28 - 0.9) / 2)
    assert stats["clipped"].item() == 1.0 and stats["kl"].item() == 0.0
    teacher, _ = policy_objective(
        torch.log(torch.tensor([[0.1]], dtype=torch.float64)),
        torch.zeros(1, 1),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 1),
        torch.tensor([True]),
        torch.ones(1, 1, dtype=torch.bool),
        **{**kw, "num_tokens": 1},
    )
    assert teacher.item() == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the entropy"):
        policy_objective(
            logp,
            logp_old,
            torch.tensor([1.0]),
            torch.ones(1, 2),
            torch.tensor([False]),
            torch.ones(1, 2, dtype=torch.bool),
            **{**kw, "entropy_coef": 0.1},
        )
