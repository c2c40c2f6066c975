"""The role-wise GRPO loss, pinned with hand-computed numbers.

Batch used by most tests (old log-probs are 0, so ratio r = exp(logprob)), eps 0.2, dual clip 3::

    row 0  act       A = +1   r = 1.0   1.5   0.5(masked out)
    row 1  rehearse  A = -2   r = 0.5   1.5   4.0

per-token loss = max(-A r, -A clip(r, 0.8, 1.2)), then min(·, 3|A|) for A < 0:

    row 0: -1.0   -1.2 (clipped)     —
    row 1:  1.6 (clipped)   3.0   min(8, 6) = 6 (dual clip)

seq_mean_token_mean = ((-2.2 / 2) + (10.6 / 3)) / 2 = 1.2166…;  token_mean = 8.4 / 5 = 1.68.
Gradient d loss / d logprob = -A r on unclipped tokens (0 on clipped ones), over the divisors:
row 0: -1 / (2 rows x 2 tokens) = -0.25; row 1 token 1: 3 / (2 rows x 3 tokens) = 0.5.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace_engine.training.loss import LossInputs, RoleMetrics, policy_loss
from envace_engine.training.optimize import mismatch, truncated_is

RATIOS = [[1.0, 1.5, 0.5], [0.5, 1.5, 4.0]]


def _inputs(
    ratios=RATIOS, mask=((1, 1, 0), (1, 1, 1)), advantages=(1.0, -2.0), ref=None, roles=None
):
    logprobs = torch.tensor(ratios, dtype=torch.float32).log().requires_grad_()
    return LossInputs(
        logprobs=logprobs,
        old_logprobs=torch.zeros(len(ratios), len(ratios[0])),
        advantages=torch.tensor(advantages),
        mask=torch.tensor(mask, dtype=torch.float32),
        role_ids=torch.arange(len(ratios)) % 2 if roles is None else torch.tensor(roles),
        ref_logprobs=ref,
    )


def test_seq_mean_token_mean_by_hand():
    inputs = _inputs()
    out = policy_loss(inputs)
    assert out.loss.item() == pytest.approx((-2.2 / 2 + 10.6 / 3) / 2, rel=1e-6)
    out.loss.backward()
    expected = torch.tensor([[-0.25, 0.0, 0.0], [0.0, 0.5, 0.0]])
    torch.testing.assert_close(inputs.logprobs.grad, expected)


def test_importance_weights_scale_each_token_by_hand():
    """TIS weights multiply the clipped surrogate per token (row 0's third token is off the
    mask): row 0 -1·2, -1.2·0.5; row 1 1.6·1, 3·0.25, 6·1."""
    weights = torch.tensor([[2.0, 0.5, 9.0], [1.0, 0.25, 1.0]])
    inputs = dataclasses.replace(_inputs(), is_weights=weights)
    out = policy_loss(inputs)
    assert out.loss.item() == pytest.approx((-2.6 / 2 + 8.35 / 3) / 2, rel=1e-6)
    out.loss.backward()
    expected = torch.tensor([[-2 / 4, 0.0, 0.0], [0.0, 0.75 / 6, 0.0]])
    torch.testing.assert_close(inputs.logprobs.grad, expected)


def test_truncated_is_takes_the_trainers_ratio_and_caps_the_weights():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    sampler = torch.tensor([[-1.5, -0.5, 50.0]])  # the third token is off the mask
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=sampler,
        advantages=torch.tensor([1.0]),
        mask=torch.tensor([[1.0, 1.0, 0.0]]),
        role_ids=torch.tensor([0]),
    )
    out = truncated_is(inputs, cap=1.5)
    torch.testing.assert_close(out.old_logprobs, logprobs.detach())
    assert out.is_weights is not None and not out.is_weights.requires_grad
    torch.testing.assert_close(out.is_weights, torch.tensor([[1.5, math.exp(-1.5), 0.0]]))
    assert truncated_is(inputs, cap=2.0).is_weights[0, 0].item() == pytest.approx(math.exp(0.5))


def test_token_mean_by_hand():
    inputs = _inputs()
    out = policy_loss(inputs, aggregation="token_mean")
    assert out.loss.item() == pytest.approx(8.4 / 5, rel=1e-6)
    out.loss.backward()
    expected = torch.tensor([[-1 / 5, 0.0, 0.0], [0.0, 3 / 5, 0.0]])
    torch.testing.assert_close(inputs.logprobs.grad, expected)


def test_dual_clip_off_and_asymmetric_eps():
    assert policy_loss(_inputs(), dual_clip=None).loss.item() == pytest.approx(
        (-2.2 / 2 + 12.6 / 3) / 2, rel=1e-6
    )
    # eps_high 0.6: the ratio 1.5 of the positive row is no longer clipped (-1.5 instead of -1.2)
    out = policy_loss(_inputs(), clip_eps_high=0.6)
    assert out.loss.item() == pytest.approx((-2.5 / 2 + 10.6 / 3) / 2, rel=1e-6)
    assert out.roles["act"].clipped == 0


def test_per_role_metrics():
    out = policy_loss(_inputs())
    act, rehearse = out.roles["act"], out.roles["rehearse"]
    assert (act.rows, act.tokens, act.clipped, act.dual_clipped) == (1, 2, 1, 0)
    assert act.loss == pytest.approx(-1.1, rel=1e-6)
    assert act.clip_frac == pytest.approx(0.5)
    assert (rehearse.rows, rehearse.tokens, rehearse.clipped, rehearse.dual_clipped) == (1, 3, 1, 1)
    assert rehearse.loss == pytest.approx(10.6 / 3, rel=1e-6)
    assert rehearse.kl == 0.0
    flat = out.metrics()
    assert flat["tokens/rehearse"] == 3.0 and flat["dual_clip_frac/rehearse"] == pytest.approx(
        1 / 3
    )


def test_k3_kl_by_hand():
    # A = 0 leaves only the KL term. ref - logprob = 0, ln 2, -ln 2:
    # k3 = exp(d) - d - 1 = 0, 1 - ln 2, ln 2 - 1/2; d k3 / d logprob = 1 - exp(d) = 0, -1, 1/2.
    logprobs = [[1.0, 1.0, 1.0]]
    ref = torch.tensor([[0.0, math.log(2), -math.log(2)]])
    inputs = _inputs(logprobs, mask=((1, 1, 1),), advantages=(0.0,), ref=ref)
    out = policy_loss(inputs, kl_coef=0.1)
    k3 = [0.0, 1 - math.log(2), math.log(2) - 0.5]
    assert out.loss.item() == pytest.approx(0.1 * sum(k3) / 3, rel=1e-6)
    assert out.roles["act"].kl == pytest.approx(sum(k3) / 3, rel=1e-6)
    out.loss.backward()
    torch.testing.assert_close(inputs.logprobs.grad, torch.tensor([[0.0, -1.0, 0.5]]) * 0.1 / 3)


def test_all_zero_mask_gives_zero_loss_not_nan():
    for aggregation in ("seq_mean_token_mean", "token_mean"):
        inputs = _inputs(mask=((0, 0, 0), (0, 0, 0)))
        out = policy_loss(inputs, aggregation=aggregation)
        assert out.loss.item() == 0.0
        out.loss.backward()
        assert torch.equal(inputs.logprobs.grad, torch.zeros(2, 3))
        assert out.roles["act"].tokens == 0 and out.roles["act"].loss == 0.0


def test_garbage_off_the_mask_cannot_leak_nan():
    inputs = _inputs()
    old = inputs.old_logprobs.clone()
    old[0, 2] = -1e4  # exp(logprob - old) would overflow to inf at this masked position
    ref = torch.zeros(2, 3)
    ref[0, 2] = 1e4
    out = policy_loss(
        LossInputs(inputs.logprobs, old, inputs.advantages, inputs.mask, inputs.role_ids, ref),
        kl_coef=0.1,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(inputs.logprobs.grad).all()


def test_micro_batches_sum_to_the_full_batch():
    ratios = [[1.0, 1.5, 0.5], [0.5, 1.5, 4.0], [1.1, 0.7, 2.0]]
    mask = ((1, 1, 0), (1, 1, 1), (1, 0, 0))
    adv = (1.0, -2.0, 0.5)
    roles = (0, 1, 0)
    for aggregation in ("seq_mean_token_mean", "token_mean"):
        full = policy_loss(_inputs(ratios, mask, adv, roles=roles), aggregation=aggregation)
        parts = [
            policy_loss(
                _inputs(ratios[s], mask[s], adv[s], roles=roles[s]),
                aggregation=aggregation,
                total_rows=3,
                total_tokens=6,
            )
            for s in (slice(0, 1), slice(1, 3))
        ]
        assert sum(p.loss.item() for p in parts) == pytest.approx(full.loss.item(), rel=1e-6)
        for role in ("act", "rehearse"):
            merged = parts[0].roles[role] + parts[1].roles[role]
            assert merged.tokens == full.roles[role].tokens
            assert merged.clipped == full.roles[role].clipped
            assert merged.loss == pytest.approx(full.roles[role].loss, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-3, 3), st.integers(1, 5)),  # (advantage, completion length)
        min_size=1,
        max_size=6,
    )
)
def test_on_policy_loss_is_minus_mean_advantage(rows):
    """At ratio 1 nothing clips: loss = -mean_b A_b and d loss/d logprob = -A_b / (B n_b)."""
    width = max(n for _, n in rows)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for _, n in rows])
    adv = torch.tensor([a for a, _ in rows])
    logprobs = (-torch.rand(len(rows), width)).requires_grad_()
    inputs = LossInputs(
        logprobs, logprobs.detach().clone(), adv, mask, torch.zeros(len(rows), dtype=torch.long)
    )
    out = policy_loss(inputs)
    assert out.loss.item() == pytest.approx(-adv.mean().item(), abs=1e-5)
    out.loss.backward()
    expected = -adv[:, None] / (len(rows) * mask.sum(1, keepdim=True)) * mask
    torch.testing.assert_close(logprobs.grad, expected)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(_inputs(), kl_coef=1e-4)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(_inputs(), dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(_inputs(), aggregation="sum")  # type: ignore[arg-type]
    bad = _inputs()
    with pytest.raises(ValueError, match="one value per row"):
        policy_loss(
            LossInputs(bad.logprobs, bad.old_logprobs, torch.ones(3), bad.mask, bad.role_ids)
        )
    assert RoleMetrics().loss == 0.0


def test_mismatch_sums_by_hand_and_k3_never_rounds_below_zero():
    """d = trainer - sampler log-prob per token; k3 = exp(d) - d - 1, by hand:
    d = 0.5 -> 1.6487212707 - 1.5 = 0.1487212707; d = -0.002 -> 0.9980019987 - 0.998 =
    1.9986673e-6; d = 1e-6 -> 5.0e-13 (the fp32 formula gives a negative number here)."""
    sampler = torch.tensor([[-1.0, -1.0, -2.0, -3.0]])
    trainer = torch.tensor([[-0.5, -1.002, -2.0 + 1e-6, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is not trained
    m = mismatch(trainer, sampler, mask)
    d = (trainer - sampler)[0, :3].double()  # the float32 differences the sums see
    assert m.tokens == 3
    assert m.abs_sum == pytest.approx(float(d.abs().sum()), rel=1e-12)
    assert m.abs_sum == pytest.approx(0.5 + 0.002 + 1e-6, rel=1e-4)
    assert m.k3_sum == pytest.approx(0.1487212707 + 1.9986673e-6 + 5.0e-13, rel=1e-6)
    one = torch.ones(1, 1)
    small = mismatch(torch.tensor([[-0.002]]), torch.zeros(1, 1), one).k3_sum
    assert small == pytest.approx(1.9986673e-6, rel=1e-5)  # fp32's formula: 2.0266e-6
    tiny = mismatch(torch.tensor([[1e-6]]), torch.zeros(1, 1), one).k3_sum
    assert tiny == pytest.approx(5.0e-13, rel=1e-2)  # fp32's formula: -5.96e-8
