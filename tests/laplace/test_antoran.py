"""Antoran et al. 2022: evidence at the linear mode (recommendation 1) and normgroups priors
(recommendation 2). Float64, tiny models; the references are independent (L-BFGS MAP on the
network itself, a fresh Laplace at the MAP weights, the layerwise prior)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.linear_mode import fit_linear_mode
from laplace_lab.laplace.normgroups import n_groups, normgroups
from laplace_lab.laplace.predictive import glm_moments
from laplace_lab.models import MLP, ResNet18, WideResNet

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _data(likelihood, n=40, d=3, c=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=DT)
    f = X @ torch.randn(d, c, generator=g, dtype=DT) + torch.randn(n, c, generator=g, dtype=DT)
    y = f.argmax(1) if likelihood == "classification" else f  # targets with signal
    return X, y, [(X[:25], y[:25]), (X[25:], y[25:])]  # two batches


def _neg_log_joint(model, X, y, likelihood, delta, sigma):
    f = model(X)
    if likelihood == "classification":
        nll = nn.functional.cross_entropy(f, y, reduction="sum")
    else:
        nll = 0.5 * (f - y).square().sum() / sigma**2
    theta = torch.cat([p.reshape(-1) for p in model.parameters()])
    return nll + 0.5 * delta * theta.square().sum()


def _map(model, X, y, likelihood, delta, sigma=1.0):
    """Independent MAP of the network itself (L-BFGS, float64)."""
    model = copy.deepcopy(model)
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = _neg_log_joint(model, X, y, likelihood, delta, sigma)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return model


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ------------------------------------------------------------------ recommendation 1: linear model
@pytest.mark.parametrize("likelihood", ["regression", "classification"])
@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_linear_mode_of_a_linear_model_is_its_map(likelihood, structure):
    torch.manual_seed(0)
    X, y, loader = _data(likelihood)
    model = nn.Linear(3, 2).to(DT)
    sigma, delta = (0.7 if likelihood == "regression" else 1.0), 0.5
    la = Laplace(model, likelihood, subset_of_weights="all", hessian_structure=structure,
                 prior_precision=delta, sigma_noise=sigma)
    la.fit(loader)
    theta_hat = _flat(model)
    res = fit_linear_mode(la, loader, optimize_prior=False)
    ref = _map(model, X, y, likelihood, delta, sigma)
    torch.testing.assert_close(res.theta_star, _flat(ref), atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(la.mean, _flat(ref), atol=1e-7, rtol=1e-7)
    assert torch.equal(_flat(model), theta_hat)  # the linearisation point is untouched
    assert (res.theta_star - theta_hat).abs().max() > 1e-2  # it did move (the test can fail)
    # the data-fit term is the linear model's = the network's at the MAP
    ref_nll = _neg_log_joint(ref, X, y, likelihood, 0.0, 1.0).detach()
    torch.testing.assert_close(la.loss, ref_nll, atol=1e-8, rtol=1e-8)
    # the GLM predictive mean is the linear model at theta*
    f_mu, _ = glm_moments(la, X)
    torch.testing.assert_close(f_mu, ref(X).detach(), atol=1e-7, rtol=1e-7)
    if likelihood == "regression":  # Gaussian: the curvature does not depend on theta
        la_ref = Laplace(ref, likelihood, subset_of_weights="all", hessian_structure=structure,
                         prior_precision=delta, sigma_noise=sigma)
        la_ref.fit(loader)
        torch.testing.assert_close(la.log_marginal_likelihood(), la_ref.log_marginal_likelihood(),
                                   atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_grad_residual_measures_the_distance_to_the_linear_mode(likelihood):
    """The result's grad_residual is ||grad L(theta*)|| / ||grad L(theta_hat)||: ~0 after a converged
    solve, and for a solve cut to one CG product (diag preconditioner: inexact) equal to the same ratio
    of the gradients of the independent MAP objective (the linear model is the network here)."""
    X, y, loader = _data(likelihood, seed=2)
    torch.manual_seed(2)
    sigma, delta = (0.7 if likelihood == "regression" else 1.0), 0.5
    base = nn.Linear(3, 2).to(DT)

    def fitted(structure):
        la = Laplace(copy.deepcopy(base), likelihood, subset_of_weights="all", hessian_structure=structure,
                     prior_precision=delta, sigma_noise=sigma)
        la.fit(loader)
        return la

    res = fit_linear_mode(fitted("full"), loader, optimize_prior=False)
    assert res.final_solve_converged and res.grad_residual < 1e-6
    cut = fit_linear_mode(fitted("diag"), loader, optimize_prior=False, max_newton=1, cg_max_iter=1)

    def grad_norm(theta):
        model = copy.deepcopy(base)
        torch.nn.utils.vector_to_parameters(theta, model.parameters())
        g = torch.autograd.grad(_neg_log_joint(model, X, y, likelihood, delta, sigma), list(model.parameters()))
        return torch.cat([t.reshape(-1) for t in g]).norm()

    ref = grad_norm(cut.theta_star) / grad_norm(_flat(base))
    assert not cut.final_solve_converged and cut.grad_residual > 1e-3
    torch.testing.assert_close(torch.tensor(cut.grad_residual, dtype=DT), ref, atol=1e-10, rtol=1e-6)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_linear_mode_evidence_equals_evidence_at_map_weights(likelihood):
    """Linearised at the MAP weights of a linear model, the linear mode is the MAP and both
    evidences agree, for any curvature; the joint (theta*, delta*) is a MAP / evidence optimum."""
    X, y, loader = _data(likelihood, seed=1)
    torch.manual_seed(1)
    sigma, delta = (0.7 if likelihood == "regression" else 1.0), 2.0
    model = _map(nn.Linear(3, 2).to(DT), X, y, likelihood, delta, sigma)
    kw = dict(subset_of_weights="all", hessian_structure="full", prior_precision=delta, sigma_noise=sigma)
    la_w = Laplace(model, likelihood, **kw)
    la_w.fit(loader)
    la = Laplace(model, likelihood, **kw)
    la.fit(loader)
    fit_linear_mode(la, loader, optimize_prior=False)
    torch.testing.assert_close(la.linear_offset, torch.zeros_like(la.linear_offset), atol=1e-7, rtol=0)
    torch.testing.assert_close(la.log_marginal_likelihood(), la_w.log_marginal_likelihood(), atol=1e-8, rtol=1e-8)

    # joint fit from the MAP weights: theta* must be the MAP of the network at the final delta*
    res = fit_linear_mode(la, loader, optimize_prior=True, tol=1e-7, n_outer=100)
    assert res.converged, res
    d_star = float(la.prior_precision)
    assert abs(d_star - delta) > 1e-2  # the precision really moved
    ref = _map(model, X, y, likelihood, d_star, sigma)
    torch.testing.assert_close(la.mean, _flat(ref), atol=1e-6, rtol=1e-6)
    # evidence stationary in delta at theta*: d/dlog delta = 0
    log_d = la.prior_precision.detach().log().requires_grad_(True)
    (g,) = torch.autograd.grad(la.log_marginal_likelihood(log_d.exp()), log_d)
    assert g.abs().max() < 1e-5


# --------------------------------------------------------------- recommendation 2: normgroups
def test_normgroups_detection_mlp_and_sequential():
    mlp = MLP((5,), 3)
    g = normgroups(mlp)
    assert g.tolist() == [0] * len(list(mlp.parameters())) and n_groups(g) == 1
    seq = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(),
                        nn.BatchNorm1d(6), nn.Linear(6, 2))
    # Linear(4,6) -> LayerNorm: grouped (weight and bias); Linear(6,6) -> ReLU -> BN: not direct
    assert normgroups(seq).tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]


def test_normgroups_detection_resnet_and_wrn():
    torch.manual_seed(0)
    resnet = ResNet18((3, 32, 32), 10, width=4)
    g = normgroups(resnet)
    params = dict(resnet.named_parameters())
    names = list(params)
    convs = [n for n in names if params[n].ndim == 4]
    by_name = dict(zip(names, g.tolist()))
    assert all(by_name[n] > 0 for n in convs)  # every conv feeds a BatchNorm directly
    assert len({by_name[n] for n in convs}) == len(convs) == n_groups(g) - 1  # one group each
    assert all(by_name[n] == 0 for n in names if params[n].ndim < 4)  # BN affine, fc: the rest

    wrn = WideResNet((3, 32, 32), 10, depth=10, widen_factor=1)
    gw = dict(zip([n for n, _ in wrn.named_parameters()], normgroups(wrn).tolist()))
    # pre-activation: conv1 -> bn2 directly; conv2 / stem / shortcut feed a residual sum
    assert all(v > 0 for n, v in gw.items() if n.endswith("conv1.weight"))
    assert all(v == 0 for n, v in gw.items() if "conv2" in n or "stem" in n or "shortcut" in n)
    # the same without normalisation: one group
    assert normgroups(ResNet18((3, 32, 32), 10, width=4, norm="none")).max() == 0


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_normgroups_prior_is_the_expanded_layerwise_prior(structure):
    torch.manual_seed(0)
    X, y, loader = _data("classification", c=3)
    model = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Tanh(), nn.Linear(5, 3)).to(DT)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                 prior_structure="normgroups")
    assert la.prior_groups.tolist() == [1, 1, 0, 0, 0, 0] and la.prior_precision.shape == (2,)
    la.fit(loader)
    lw = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                 prior_structure="layerwise")
    lw.fit(loader)
    pg = torch.tensor([0.3, 4.0], dtype=DT, requires_grad=True)
    lm = la.log_marginal_likelihood(pg)
    torch.testing.assert_close(lm, lw.log_marginal_likelihood(pg[torch.tensor([1, 1, 0, 0, 0, 0])]))
    (grad,) = torch.autograd.grad(lm, pg)
    assert grad.shape == (2,) and bool((grad != 0).all())
    _, v1 = glm_moments(la, X[:5])
    _, v2 = glm_moments(lw, X[:5])
    torch.testing.assert_close(v1, v2)
    la.optimize_prior_precision(n_steps=5)
    assert la.prior_precision.shape == (2,)
    with pytest.raises(ValueError, match="prior_groups"):
        Laplace(model, "classification", subset_of_weights="all", prior_structure="normgroups",
                prior_groups=torch.tensor([0, 1]))


# --------------------------------------------------------------- Proposition 3: scale invariance
def _norm_net(kind, seed=0):
    torch.manual_seed(seed)
    norm = nn.BatchNorm1d(6, eps=0.0) if kind == "batchnorm" else nn.LayerNorm(6, eps=0.0)
    model = nn.Sequential(nn.Linear(3, 6), norm, nn.ReLU(), nn.Linear(6, 2)).to(DT)
    if kind == "batchnorm":  # eval mode, fixed running statistics
        norm.running_mean.copy_(torch.randn(6, dtype=DT) * 0.3)
        norm.running_var.copy_(torch.rand(6, dtype=DT) + 0.5)
    return model.eval()


def _rescale(model, k):
    m = copy.deepcopy(model)
    with torch.no_grad():
        m[0].weight.mul_(k)
        m[0].bias.mul_(k)
        if isinstance(m[1], nn.BatchNorm1d):  # what training at the rescaled weights would give
            m[1].running_mean.mul_(k)
            m[1].running_var.mul_(k * k)
    return m


def _fit(model, loader, structure, prior_structure, evidence_point, init=1.0):
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure,
                 prior_structure=prior_structure, prior_precision=init, sigma_noise=0.5)
    la.fit(loader)
    if evidence_point == "linear_mode":  # Gaussian: one Newton step solves the quadratic exactly
        res = fit_linear_mode(la, loader, tol=1e-5, n_outer=100, round_newton=1)
        assert res.converged, res
    elif evidence_point == "weights":
        la.optimize_prior_precision(method="marglik", n_steps=400, lr=0.05)
    return la


def _rel_change(a, b):
    return float(((b - a).abs() / a.abs()).max())


@pytest.mark.parametrize("kind,structure", [("batchnorm", "full"), ("layernorm", "kron")])
def test_scale_invariance_fixed_precision(kind, structure):
    """Proposition 3 directly: rescaling a normalised group by k and its precision by 1 / k^2
    leaves the GLM predictive variance unchanged; a single shared precision cannot do that."""
    X, y, loader = _data("regression", n=30)
    Xt = torch.randn(7, 3, dtype=DT, generator=torch.Generator().manual_seed(5)) * 2
    model, k = _norm_net(kind), 3.0
    scaled = _rescale(model, k)
    torch.testing.assert_close(scaled(Xt), model(Xt))  # the network function is invariant
    pa = torch.tensor([2.0, 0.7], dtype=DT)
    a = _fit(model, loader, structure, "normgroups", None, init=pa)
    b = _fit(scaled, loader, structure, "normgroups", None, init=pa * torch.tensor([1.0, 1 / k**2], dtype=DT))
    assert a.prior_groups.tolist() == [1, 1, 0, 0, 0, 0]
    torch.testing.assert_close(glm_moments(b, Xt)[1], glm_moments(a, Xt)[1], rtol=1e-8, atol=1e-12)
    a = _fit(model, loader, structure, "scalar", None)
    b = _fit(scaled, loader, structure, "scalar", None)
    assert _rel_change(glm_moments(a, Xt)[1], glm_moments(b, Xt)[1]) > 1e-2


def test_scale_invariance_evidence_at_linear_mode():
    """BatchNorm network, evidence at the linear mode (joint fit from the same initial prior):
    with normgroups the optimal group precision scales by 1 / k^2 and the predictive (mean and
    variance) does not change when the normalised weights are rescaled by k; with a single
    precision the variance does change."""
    X, y, loader = _data("regression", n=30)
    Xt = torch.randn(7, 3, dtype=DT, generator=torch.Generator().manual_seed(5)) * 2
    model, k = _norm_net("batchnorm"), 3.0
    scaled = _rescale(model, k)
    a = _fit(model, loader, "full", "normgroups", "linear_mode")
    b = _fit(scaled, loader, "full", "normgroups", "linear_mode")
    # both alternations stop at log-precision steps < 1e-5: agreement to ~1e-5 (measured 4e-5)
    torch.testing.assert_close(b.prior_precision[1] * k**2, a.prior_precision[1], rtol=5e-4, atol=0)
    torch.testing.assert_close(b.prior_precision[0], a.prior_precision[0], rtol=5e-4, atol=0)
    ma, va = glm_moments(a, Xt)
    mb, vb = glm_moments(b, Xt)
    torch.testing.assert_close(vb, va, rtol=5e-4, atol=1e-10)
    torch.testing.assert_close(mb, ma, rtol=0, atol=5e-4)
    torch.testing.assert_close(b.log_marginal_likelihood(), a.log_marginal_likelihood(), rtol=1e-6, atol=1e-6)
    assert (ma - model(Xt)).abs().max() > 1e-3  # the linear mode moved the mean

    a = _fit(model, loader, "full", "scalar", "linear_mode")
    b = _fit(scaled, loader, "full", "scalar", "linear_mode")
    assert _rel_change(glm_moments(a, Xt)[1], glm_moments(b, Xt)[1]) > 0.1  # measured 0.70


# ------------------------------------------------------------------ solve on a data subset (a CPU budget)
def test_subset_rows_is_seeded_and_complete_sets_pass_through():
    from laplace_lab.laplace.linear_mode import subset_rows

    X, y, loader = _data("classification")
    same, scale, n = subset_rows(loader, 40)
    assert same == loader and scale == 1.0 and n == 40
    a, scale, n = subset_rows(loader, 30, seed=3)
    b, _, _ = subset_rows(loader, 30, seed=3)
    c, _, _ = subset_rows(loader, 30, seed=4)
    assert scale == pytest.approx(40 / 30) and n == 40 and [len(yb) for _, yb in a] == [25, 5]
    xa = torch.cat([xb for xb, _ in a])
    assert torch.equal(xa, torch.cat([xb for xb, _ in b])) and not torch.equal(xa, torch.cat([xb for xb, _ in c]))
    rows = [int((X == r).all(1).nonzero()) for r in xa]  # distinct rows of X, labels kept with them
    assert len(set(rows)) == 30 and torch.equal(torch.cat([yb for _, yb in a]), y[rows])


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_solve_on_a_subset_is_the_scaled_subset_map_with_the_full_data_loss(likelihood):
    """``solve_subset=n``: theta* is the MAP of the linear model with the subset's NLL scaled by
    N / n; ``la.loss`` is the linear model's NLL over all N rows at theta*."""
    from laplace_lab.laplace.linear_mode import LinearisedObjective, subset_rows

    X, y, loader = _data(likelihood)
    model = nn.Linear(3, 2).to(DT)
    sigma, delta = (0.7 if likelihood == "regression" else 1.0), 0.5
    la = Laplace(model, likelihood, subset_of_weights="all", hessian_structure="full",
                 prior_precision=delta, sigma_noise=sigma)
    la.fit(loader)
    fit_linear_mode(la, loader, optimize_prior=False, solve_subset=20, seed=5)
    sub, scale, _ = subset_rows(loader, 20, seed=5)
    Xs, ys = torch.cat([b[0] for b in sub]), torch.cat([b[1] for b in sub])
    # the scaled subset objective of a linear model = the network's, with delta / scale
    ref = _map(model, Xs, ys, likelihood, delta / scale, sigma)
    torch.testing.assert_close(la.mean, _flat(ref), atol=1e-7, rtol=1e-7)
    full = LinearisedObjective(la, loader).nll(la.linear_offset)
    torch.testing.assert_close(la.loss, full, atol=1e-10, rtol=1e-10)
    assert not torch.allclose(la.loss, LinearisedObjective(la, sub, scale=scale).nll(la.linear_offset))
    with pytest.raises(ValueError, match="solve_subset"):
        fit_linear_mode(la, loader, optimize_prior=False, solve_subset=0)
