"""Tests of the GRPO / DAPO loss maths (pivot/losses/grpo.py)."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pivot.errors import ConfigError
from pivot.losses.grpo import (
    GRPOLoss,
    clipped_surrogate,
    group_advantages,
    kl_k3,
    token_logprobs,
)


def test_a_group_with_equal_rewards_has_zero_advantages():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    adv = group_advantages(rewards, group_size=3)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert not torch.equal(adv[3:], torch.zeros(3))


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([0.0, 1.0, 10.0, 30.0])
    adv = group_advantages(rewards, group_size=2, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, -1.0, 1.0]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=4, max_size=4), st.floats(-3, 3), st.floats(0.5, 4))
def test_advantages_are_invariant_to_shifting_and_scaling_rewards(values, shift, scale):
    r = torch.tensor(values, dtype=torch.float64)
    a = group_advantages(r, 4, eps=0.0) if r.std() > 1e-3 else None
    if a is None:
        return
    b = group_advantages(r * scale + shift, 4, eps=0.0)
    assert torch.allclose(a, b, atol=1e-9)
    assert abs(float(a.mean())) < 1e-9


def test_advantages_reject_rows_that_do_not_split_into_groups():
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages(torch.zeros(6), group_size=4)


def test_token_logprobs_pick_the_next_token_and_leave_column_zero_empty():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    lp = token_logprobs(logits, ids)
    assert lp.shape == (2, 5)
    assert torch.equal(lp[:, 0], torch.zeros(2))
    want = torch.log_softmax(logits[1, 2], -1)[ids[1, 3]]
    assert torch.allclose(lp[1, 3], want)


def _grad_of_surrogate(ratio: float, adv: float, eps_low=0.2, eps_high=0.28):
    lp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, clipped = clipped_surrogate(lp, old, torch.tensor([adv], dtype=torch.float64),
                                      eps_low, eps_high)
    loss.sum().backward()
    return float(loss.detach()), float(lp.grad), bool(clipped)


def test_clip_higher_is_asymmetric_at_its_boundaries():
    # Positive advantage: clipped above 1 + eps_high = 1.28, not above 1.2.
    _, g, c = _grad_of_surrogate(1.25, 1.0)
    assert not c and g == pytest.approx(-1.25)
    loss, g, c = _grad_of_surrogate(1.30, 1.0)
    assert c and g == 0.0 and loss == pytest.approx(-1.28)
    # Negative advantage: clipped below 1 - eps_low = 0.8.
    _, g, c = _grad_of_surrogate(0.81, -1.0)
    assert not c and g == pytest.approx(0.81)
    loss, g, c = _grad_of_surrogate(0.75, -1.0)
    assert c and g == 0.0 and loss == pytest.approx(0.8)


def test_the_clip_never_removes_the_gradient_on_the_pessimistic_side():
    # A > 0 with a small ratio, and A < 0 with a large ratio, keep their gradient.
    _, g, c = _grad_of_surrogate(0.5, 1.0)
    assert not c and g == pytest.approx(-0.5)
    _, g, c = _grad_of_surrogate(2.0, -1.0)
    assert not c and g == pytest.approx(2.0)


def test_gradient_is_zero_exactly_on_the_clipped_tokens():
    torch.manual_seed(1)
    lp = (torch.randn(4, 6) * 0.4).requires_grad_()
    old = torch.zeros(4, 6)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    loss, clipped = clipped_surrogate(lp, old, adv, 0.2, 0.28)
    loss.sum().backward()
    assert clipped.any() and (~clipped).any()
    assert torch.equal(lp.grad[clipped], torch.zeros(int(clipped.sum())))
    assert (lp.grad[~clipped] != 0).all()


def test_loss_is_the_token_mean_over_response_tokens_and_ignores_padding():
    lp = torch.zeros(2, 4, requires_grad=True)
    old = torch.zeros(2, 4)
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])
    adv = torch.tensor([1.0, -3.0])
    loss, m = GRPOLoss(GRPOLoss.Config())(lp, old, adv, mask)
    # ratio 1 everywhere: token loss = -A; (3 * -1 + 1 * 3) / 4 tokens = 0
    assert float(loss) == pytest.approx(0.0)
    loss.backward()
    assert torch.equal(lp.grad[mask == 0], torch.zeros(4))
    assert float(lp.grad[0, 1]) == pytest.approx(-1 / 4)
    assert float(lp.grad[1, 1]) == pytest.approx(3 / 4)
    assert float(m["ratio_mean"]) == pytest.approx(1.0)


def test_splitting_the_batch_with_a_global_token_count_sums_to_the_whole_loss():
    torch.manual_seed(2)
    lp = torch.randn(4, 5) * 0.3
    old = torch.randn(4, 5) * 0.3
    mask = (torch.rand(4, 5) > 0.3).long()
    adv = torch.randn(4)
    fn = GRPOLoss(GRPOLoss.Config())
    whole, _ = fn(lp, old, adv, mask)
    n = float(mask.sum())
    part = fn(lp[:2], old[:2], adv[:2], mask[:2], n)[0] + fn(lp[2:], old[2:], adv[2:],
                                                              mask[2:], n)[0]
    assert torch.allclose(whole, part, atol=1e-6)


def test_kl_term_is_off_by_default_and_needs_reference_logprobs_when_on():
    lp = torch.randn(2, 3)
    mask = torch.ones(2, 3)
    adv = torch.zeros(2)
    loss, m = GRPOLoss(GRPOLoss.Config())(lp, lp, adv, mask)
    assert "kl" not in m and float(loss) == 0.0
    with pytest.raises(ValueError, match="ref_logprobs"):
        GRPOLoss(GRPOLoss.Config(kl_coef=0.1))(lp, lp, adv, mask)
    ref = lp + 0.5
    loss, m = GRPOLoss(GRPOLoss.Config(kl_coef=0.1))(lp, lp, adv, mask, ref_logprobs=ref)
    assert float(m["kl"]) > 0 and float(loss) == pytest.approx(0.1 * float(m["kl"]))
    assert torch.equal(kl_k3(lp, lp), torch.zeros(2, 3))


def test_bad_clip_settings_name_the_field():
    with pytest.raises(ConfigError, match="eps_low"):
        GRPOLoss(GRPOLoss.Config(eps_low=1.5))
    with pytest.raises(ConfigError, match="kl_coef"):
        GRPOLoss(GRPOLoss.Config(kl_coef=-1.0))


def test_without_std_scaling_advantages_keep_the_rewards_scale():
    # a group all wrong whose GenRM scores differ by 0.1: std scaling makes that noise +-1
    rewards = torch.tensor([0.8, 0.9, 0.8, 0.9, 0.0, 1.9, 0.0, 1.9])
    scaled = group_advantages(rewards, 4)
    plain = group_advantages(rewards, 4, scale_by_std=False)
    assert torch.allclose(scaled[:4], torch.tensor([-1.0, 1.0, -1.0, 1.0]), atol=1e-4)
    assert torch.allclose(plain, torch.tensor([-0.05, 0.05, -0.05, 0.05,
                                               -0.95, 0.95, -0.95, 0.95]))
