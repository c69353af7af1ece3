"""``laplace.hyper.MarglikOptimizer``: the one Adam loop on the log prior precisions / log sigma, used by
post-hoc ``optimize_prior_precision(method="marglik")`` and the online marglik callback.

Reference: the loop post-hoc tuning ran before (plain ``torch.optim.Adam`` on autograd gradients of
``Laplace.log_marginal_likelihood``), float64."""

from __future__ import annotations

import math

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


class _NoHostReads:
    """Context: reading a tensor on the host (``item``, ``bool``, ``float``, ``int``, ``tolist``)
    raises, so a loop that synchronises with the device per step fails on the CPU too."""

    NAMES = ("item", "__bool__", "__float__", "__int__", "tolist")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def refuse(*args, **kwargs):
            raise AssertionError("host read of a tensor inside the hyper-step loop")

        for n in self.NAMES:
            setattr(torch.Tensor, n, refuse)
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)


@pytest.mark.parametrize("likelihood,prior_structure", [("classification", "layerwise"), ("regression", "layerwise"),
                                                        ("regression", "scalar")])
def test_device_loop_equals_the_step_loop(likelihood, prior_structure):
    """``run_closed_form`` (no host read per step) = ``step`` repeated: values, Adam state, counts,
    with clamping active and a cosine rate schedule on the accepted steps."""
    la = _fit(likelihood, "kron", prior_structure)
    sigma = la.sigma_noise.log() if likelihood == "regression" else None
    kw = dict(lr=0.3, log_min=-2.0, log_max=0.3)
    a, b = MarglikOptimizer(la.prior_precision.log(), sigma, **kw), MarglikOptimizer(la.prior_precision.log(), sigma, **kw)
    fast = a.closed_form(la)

    def rate(done):
        return 0.05 + 0.5 * (0.3 - 0.05) * (1 + torch.cos(torch.pi * (done / 40).clamp(max=1.0)))

    with _NoHostReads():
        n = a.run_closed_form(fast, 30, lr=rate)
    for i in range(30):
        b.set_lr(0.05 + 0.5 * (0.3 - 0.05) * (1 + math.cos(math.pi * min(i / 40, 1.0))))
        assert b.step(la, fast)
    assert int(n) == 30
    for p, q in zip(a.params, b.params):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
    assert float(a.log_prior.detach().max()) == pytest.approx(0.3)  # the clamp was active
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    for i in sa:
        assert sa[i]["step"].dtype == sb[i]["step"].dtype and float(sa[i]["step"]) == float(sb[i]["step"]) == 30
        torch.testing.assert_close(sa[i]["exp_avg"], sb[i]["exp_avg"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"], rtol=1e-12, atol=1e-14)


def test_device_loop_rejects_like_step():
    """A non-finite gradient at some steps: those are rejected (values and Adam state kept), the
    others accepted, as with ``step``; the count comes back as one tensor."""
    la = _fit("classification", "kron", "layerwise")
    fast = MarglikOptimizer.closed_form(la)
    calls = {"n": 0}

    class Flaky:
        def grad_log(self, log_prior, log_sigma=None):
            calls["n"] += 1
            g, s = fast.grad_log(log_prior, log_sigma)
            return (g * float("nan"), s) if calls["n"] % 3 == 0 else (g, s)

    a = MarglikOptimizer(la.prior_precision.log(), lr=0.1)
    b = MarglikOptimizer(la.prior_precision.log(), lr=0.1)
    n = a.run_closed_form(Flaky(), 10)
    calls["n"] = 0
    results = [b.step(la, Flaky()) for _ in range(10)]
    assert int(n) == sum(results) == 7
    torch.testing.assert_close(a.log_prior, b.log_prior, rtol=1e-12, atol=1e-14)
    assert float(a.optimizer.state[a.log_prior]["step"]) == 7


def test_one_kernel_group_ops_equal_the_cpu_ones():
    """The CUDA forms of the group expansion and sums (``one_kernel``) give the CPU forms' values."""
    la = _fit("classification", "kron", "layerwise")
    fast = MarglikOptimizer.closed_form(la)
    log_prior = torch.linspace(-1, 1, la.n_layers, dtype=la.dtype)
    ref = fast.grad_log(log_prior)[0]
    delta = log_prior.exp()
    plain = fast._expand(delta), fast._group_sums(fast.h)
    fast.one_kernel = True
    assert torch.equal(fast._expand(delta), plain[0])
    torch.testing.assert_close(fast._group_sums(fast.h), plain[1], rtol=1e-13, atol=0)
    torch.testing.assert_close(fast.grad_log(log_prior)[0], ref, rtol=1e-13, atol=1e-15)
