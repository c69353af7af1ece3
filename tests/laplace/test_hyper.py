"""``laplace.hyper.MarglikOptimizer``: the one Adam loop on the log prior precisions / log sigma, used by
post-hoc ``optimize_prior_precision(method="marglik")`` and the online marglik callback.

Reference: the loop post-hoc tuning ran before (plain ``torch.optim.Adam`` on autograd gradients of
``Laplace.log_marginal_likelihood``), float64."""

from __future__ import annotations

import pytest
import torch
from laplace_refs import data, loader, mlp

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.hyper import MarglikOptimizer, adam_update


def _fit(likelihood, structure, prior_structure):
    model = mlp(d_out=2)
    X, y = data("mlp", likelihood, d_out=2)
    la = Laplace(model, likelihood, subset_of_weights="all", hessian_structure=structure,
                 prior_structure=prior_structure, prior_precision=0.7, sigma_noise=1.3 if likelihood == "regression"
                 else 1.0, structure_options={"n_eigs": 5} if structure == "lowrank" else None)
    la.fit(loader(X, y, 4))
    return la


def _old_loop(la, n_steps, lr, tune_sigma):
    log_pp = la.prior_precision.detach().clone().log().requires_grad_(True)
    params = [log_pp]
    if tune_sigma:
        log_sigma = la.sigma_noise.detach().clone().log().requires_grad_(True)
        params.append(log_sigma)
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(n_steps):
        opt.zero_grad()
        neg = -la.log_marginal_likelihood(log_pp.exp(), log_sigma.exp() if tune_sigma else None)
        neg.backward()
        opt.step()
    return log_pp.detach().exp(), (log_sigma.detach().exp() if tune_sigma else None)


@pytest.mark.parametrize("structure,prior_structure,fast", [
    ("kron", "layerwise", True), ("diag", "diagonal", True), ("full", "layerwise", True),
    ("lowrank", "scalar", False), ("kron", "scalar", True)])
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_posthoc_marglik_equals_the_old_adam_loop(structure, prior_structure, fast, likelihood):
    tune = likelihood == "regression"
    la = _fit(likelihood, structure, prior_structure)
    start = (la.prior_precision.clone(), la.sigma_noise.clone())
    ref_prior, ref_sigma = _old_loop(la, 25, 0.1, tune)
    la.prior_precision, la.sigma_noise = start
    assert (MarglikOptimizer.closed_form(la) is not None) == fast  # the fast path is chosen automatically
    la.optimize_prior_precision(method="marglik", n_steps=25, lr=0.1, tune_sigma_noise=tune)
    torch.testing.assert_close(la.prior_precision, ref_prior, rtol=1e-9, atol=1e-12)
    assert not torch.equal(la.prior_precision, start[0].expand_as(la.prior_precision))
    if tune:
        torch.testing.assert_close(la.sigma_noise, ref_sigma, rtol=1e-9, atol=1e-12)


def test_rejection_and_clamping():
    la = _fit("regression", "kron", "layerwise")
    opt = MarglikOptimizer(la.prior_precision.log(), la.sigma_noise.log(), lr=50.0, log_min=-1.0, log_max=1.0)
    accepted, rejected = opt.run(la, 5)
    assert (accepted, rejected) == (5, 0)
    assert opt.log_prior.abs().max() <= 1.0 and opt.log_sigma.abs() <= 1.0
    before = [p.detach().clone() for p in opt.params]
    state = opt.state_dict()["adam"]["state"]
    opt.marglik = lambda la: torch.tensor(float("nan"), dtype=torch.float64, requires_grad=True) * 1
    assert not opt.step(la, None)  # a NaN marglik is rejected
    assert all(torch.equal(p, b) for p, b in zip(opt.params, before))
    after = opt.state_dict()["adam"]["state"]
    assert all(torch.equal(state[i]["exp_avg"], after[i]["exp_avg"]) for i in state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_update_is_torch_adam_step(dtype):
    torch.manual_seed(0)
    a = torch.randn(5, dtype=dtype, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    oa, ob = torch.optim.Adam([a], lr=0.1, betas=(0.8, 0.99), eps=1e-6), torch.optim.Adam([b], lr=0.1, betas=(0.8, 0.99),
                                                                                           eps=1e-6)
    for i in range(20):
        g = torch.randn(5, dtype=dtype)
        a.grad, b.grad = g.clone(), g.clone()
        for group in (*oa.param_groups, *ob.param_groups):
            group["lr"] = 0.1 / (1 + i)
        oa.step()
        adam_update(ob)
    assert torch.equal(a, b)
    sa, sb = oa.state_dict()["state"][0], ob.state_dict()["state"][0]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="only plain Adam"):
        adam_update(torch.optim.Adam([a], amsgrad=True))
