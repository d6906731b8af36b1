"""KL estimators against closed forms on small categorical distributions (exact expectations)."""

import pytest
import torch

from prorl_bench.rl.kl import K3Params, KLEstimator, k1, k2, k2_ref_over_old, k3


def _dists(seed=0, n=7):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(n, generator=g, dtype=torch.float64)
    return theta, torch.log_softmax(ref, -1)


def _expect(p, values):
    """E_{x~p}[values(x)] with p treated as the sampling distribution (no gradient through it)."""
    return (p.detach() * values).sum()


def test_k1_and_k3_are_unbiased_for_reverse_kl():
    theta, logq = _dists()
    logp = torch.log_softmax(theta, -1)
    kl = (logp.exp() * (logp - logq)).sum()
    torch.testing.assert_close(_expect(logp.exp(), k1(logp, logq)), kl)
    torch.testing.assert_close(_expect(logp.exp(), k3(logp, logq)), kl)


def test_k2_is_biased_but_its_on_policy_gradient_is_the_reverse_kl_gradient():
    theta, logq = _dists(1)
    logp = torch.log_softmax(theta, -1)
    kl = (logp.exp() * (logp - logq)).sum()
    (grad_kl,) = torch.autograd.grad(kl, theta, retain_graph=True)
    value = _expect(logp.exp(), k2(logp, logq))
    assert not torch.isclose(value, kl)  # biased value
    (grad_k2,) = torch.autograd.grad(value, theta)
    torch.testing.assert_close(grad_k2, grad_kl)


def test_k3_loss_gradient_is_the_forward_kl_gradient_and_k1_loss_gradient_is_zero():
    theta, logq = _dists(2)
    logp = torch.log_softmax(theta, -1)
    fwd_kl = (logq.exp() * (logq - logp)).sum()  # KL(ref || theta)
    (grad_fwd,) = torch.autograd.grad(fwd_kl, theta, retain_graph=True)
    (grad_k3,) = torch.autograd.grad(_expect(logp.exp(), k3(logp, logq)), theta, retain_graph=True)
    torch.testing.assert_close(grad_k3, grad_fwd)
    (grad_k1,) = torch.autograd.grad(_expect(logp.exp(), k1(logp, logq)), theta)
    torch.testing.assert_close(grad_k1, torch.zeros_like(grad_k1))


def test_k3_nonnegative_and_zero_at_equality():
    logp = torch.log_softmax(torch.randn(50), -1)
    logq = torch.log_softmax(torch.randn(50), -1)
    assert (k3(logp, logq) >= 0).all()
    assert torch.equal(k3(logp, logp), torch.zeros(50))


def test_clamps_bound_k3_only():
    logp = torch.tensor([0.0, 0.0])
    logq = torch.tensor([-100.0, 100.0])
    v = KLEstimator("k3", log_ratio_clamp=20.0, kl_clamp=10.0)(logp, logq)
    assert torch.isfinite(v).all() and (v.abs() <= 10.0).all()  # no overflow in exp, value clamped
    assert torch.equal(KLEstimator("k1")(logp, logq), torch.tensor([100.0, -100.0]))  # unclamped
    assert torch.equal(KLEstimator("k2")(logp, logq), torch.tensor([5000.0, 5000.0]))


def test_k2_ref_over_old_matches_blog_formula_and_carries_no_gradient():
    logp_old = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    logp_ref = torch.tensor([-1.5, -1.0, -30.0])
    v = k2_ref_over_old(logp_ref, logp_old)
    expected = 0.5 * torch.tensor([0.5, 1.0, 10.0]) ** 2  # log-ratio clamped to +-10
    torch.testing.assert_close(v, expected)
    assert not v.requires_grad


def test_the_kl_gradient_survives_on_the_tokens_that_drifted_furthest():
    """Audit item 7: a value clamp on every estimator zeroed k2's gradient for |l| > 4.47.
    k1 and k2 are unclamped (gradient 1 and l everywhere); k3 keeps verl's clamp, whose price
    (no gradient once k3 > 10: l < -2.61 or l > 11) is documented and pinned here."""
    logp_ref = torch.zeros(6)
    ells = torch.tensor([-12.0, -5.0, -2.0, 2.0, 5.0, 12.0])
    for name, expected in (
        ("k1", torch.ones(6)),
        ("k2", ells),
        ("k3", torch.where((ells < -2.61) | (ells > 11.0), 0.0, 1.0 - torch.exp(-ells))),
    ):
        logp = ells.clone().requires_grad_(True)
        KLEstimator(name)(logp, logp_ref).sum().backward()
        assert torch.allclose(logp.grad, expected, atol=1e-5), (name, logp.grad)
    # the clamp boundary of k3 itself: just inside it the gradient is alive
    logp = torch.tensor([-2.6, 10.9], requires_grad=True)
    KLEstimator("k3")(logp, torch.zeros(2)).sum().backward()
    assert (logp.grad.abs() > 0.5).all()


# -- k3 x pi_theta/pi_old (kl_estimator.importance_weight=true: TRL's use_bias_correction_kl) --------


def _iw_k3():
    return KLEstimator("k3", K3Params(importance_weight=True))


def test_importance_weighted_k3_off_policy_is_unbiased_for_kl_and_its_gradient_is_the_reverse_kl_gradient():
    """Tokens drawn from pi_old != pi_theta (a later PPO epoch): E_old[w k3] = KL(theta || ref) exactly,
    and its gradient is grad KL(theta || ref); plain k3 is biased off-policy (value and gradient)."""
    theta, logq = _dists(3)
    logp = torch.log_softmax(theta, -1)
    logp_old = torch.log_softmax(torch.randn(7, generator=torch.Generator().manual_seed(9), dtype=torch.float64), -1)
    p_old = logp_old.exp()
    kl = (logp.exp() * (logp - logq)).sum()
    (grad_kl,) = torch.autograd.grad(kl, theta, retain_graph=True)
    value = _expect(p_old, _iw_k3()(logp, logq, logp_old))
    torch.testing.assert_close(value, kl)
    (grad_iw,) = torch.autograd.grad(value, theta, retain_graph=True)
    torch.testing.assert_close(grad_iw, grad_kl)
    plain = _expect(p_old, KLEstimator("k3")(logp, logq, logp_old))  # the weight is off by default
    assert not torch.isclose(plain, kl)


def test_importance_weighted_k3_on_policy_keeps_k3s_value_but_takes_the_reverse_kl_gradient():
    """At pi_old = pi_theta the weight's value is exactly 1 (same per-token values as k3), but it is
    differentiable: the expected gradient becomes the reverse-KL gradient, not k3's forward-KL one."""
    theta, logq = _dists(4)
    logp = torch.log_softmax(theta, -1)
    old = logp.detach()
    per_token = _iw_k3()(logp, logq, old)
    torch.testing.assert_close(per_token, k3(logp, logq))
    kl = (logp.exp() * (logp - logq)).sum()
    fwd_kl = (logq.exp() * (logq - logp)).sum()
    (grad_kl,) = torch.autograd.grad(kl, theta, retain_graph=True)
    (grad_fwd,) = torch.autograd.grad(fwd_kl, theta, retain_graph=True)
    (grad_iw,) = torch.autograd.grad(_expect(old.exp(), per_token), theta)
    torch.testing.assert_close(grad_iw, grad_kl)
    assert not torch.allclose(grad_iw, grad_fwd)  # the two estimators' gradients really differ here


def test_importance_weighted_k3_refuses_to_run_without_pi_old_and_plain_k3_ignores_it():
    logp = torch.log_softmax(torch.randn(5), -1)
    logq = torch.log_softmax(torch.randn(5), -1)
    with pytest.raises(ValueError, match="logp_old"):
        _iw_k3()(logp, logq)
    torch.testing.assert_close(KLEstimator("k3")(logp, logq, logq), KLEstimator("k3")(logp, logq))
    # the reward placement takes the estimator at pi_old itself: weight 1, the same values as k3
    torch.testing.assert_close(_iw_k3().reward(logp, logq), KLEstimator("k3").reward(logp, logq))
