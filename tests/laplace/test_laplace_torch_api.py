"""The laplace-torch API items (this engine as a drop-in), checked against laplace-torch on the same model (float64)
or against dense ``torch.func`` references where laplace-torch has no counterpart."""

from __future__ import annotations

import math
import warnings
from collections import UserDict

import pytest
import torch
from laplace_refs import dense_jacobian, loader, mlp, model_fn
from torch import nn

from laplace_lab.laplace import Laplace, compat
from laplace_lab.laplace.structures.kron import KronPrecision

laplace_torch = pytest.importorskip("laplace")
DT = torch.float64


def _data(n=12, d_in=3, d_out=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g, dtype=DT), torch.randn(n, d_out, generator=g, dtype=DT)


def _pair(lik="regression", subset="all", structure="full", **kw):
    model = mlp(d_out=2)
    X, y = _data()
    if lik == "classification":
        y = y[:, 0].gt(0).long()
    sigma = 0.7 if lik == "regression" else 1.0
    ours = Laplace(model, lik, subset_of_weights=subset, hessian_structure=structure, sigma_noise=sigma,
                   prior_precision=0.9, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = laplace_torch.Laplace(model, lik, subset_of_weights=subset, hessian_structure=structure,
                                       sigma_noise=sigma, prior_precision=0.9)
        ours.fit(loader(X, y))
        theirs.fit(loader(X, y))
    return model, X, ours, theirs


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_regression_call_diagonal_and_joint_match(structure, subset):
    _, X, ours, theirs = _pair("regression", subset, structure)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m_b, v_b = theirs(X, pred_type="glm", diagonal_output=True)
        mj_b, cj_b = theirs(X, pred_type="glm", joint=True)
    m_a, v_a = ours(X, diagonal_output=True)
    torch.testing.assert_close(m_a, m_b)
    torch.testing.assert_close(v_a, v_b, rtol=1e-6, atol=1e-10)
    mj_a, cj_a = ours(X, joint=True)
    torch.testing.assert_close(mj_a, mj_b)
    torch.testing.assert_close(cj_a, cj_b, rtol=1e-6, atol=1e-8)  # full: their Cholesky inverse, our solve


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_functional_variance_covariance_log_prob_match(structure):
    model, X, ours, theirs = _pair("classification", "all", structure)
    Js = dense_jacobian(model, ours, X[:4])
    torch.testing.assert_close(ours.functional_variance(Js), theirs.functional_variance(Js), rtol=1e-6, atol=1e-10)
    torch.testing.assert_close(ours.functional_covariance(Js), theirs.functional_covariance(Js),
                               rtol=1e-6, atol=1e-10)
    Js_a, f_a = ours.jacobians(X[:4])
    torch.testing.assert_close(Js_a, Js)
    torch.testing.assert_close(f_a, model(X[:4]).detach())
    v = ours.mean + 0.1 * torch.randn(ours.n_params, generator=torch.Generator().manual_seed(0), dtype=DT)
    for normalized in (True, False):
        torch.testing.assert_close(ours.log_prob(v, normalized), theirs.log_prob(v, normalized), rtol=1e-8, atol=1e-8)


def test_kron_precision_view_matches():
    _, _, ours, theirs = _pair("classification", "all", "kron")
    P = ours.posterior_precision
    assert isinstance(P, KronPrecision)
    torch.testing.assert_close(P.to_matrix(), theirs.posterior_precision.to_matrix(), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(P.to_matrix(-1), theirs.posterior_precision.to_matrix(exponent=-1),
                               rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(P.logdet(), theirs.posterior_precision.logdet())
    # H_facs rebuild the curvature blocks: G (x) A per weight, G per bias
    H = ours.structure.dense_precision(torch.ones((), dtype=DT), torch.zeros(1, dtype=DT))
    i = 0
    for facs, size in zip(ours.H_facs, [p.numel() for p in ours.params]):
        block = torch.kron(facs[0], facs[1]) if len(facs) == 2 else (facs[0] if facs[0].ndim == 2 else facs[0].diag())
        torch.testing.assert_close(block, H[i:i + size, i:i + size], rtol=1e-8, atol=1e-10)
        i += size


def test_functional_and_predictive_samples():
    model, X, ours, _ = _pair("classification", "all", "full")
    S = 4000
    fs = ours.functional_samples(X, n_samples=S, generator=torch.Generator().manual_seed(0))
    assert fs.shape == (S, len(X), 2)
    Js = dense_jacobian(model, ours, X)
    cov = ours.functional_variance(Js)
    fmap = model(X).detach()
    se = (cov.diagonal(dim1=1, dim2=2) / S).sqrt()
    assert ((fs.mean(0) - fmap).abs() <= 5 * se).all()
    # diagonal_output: f + sqrt(var) eps with the generator's draws, exactly
    g = torch.Generator().manual_seed(3)
    fd = ours.functional_samples(X, n_samples=5, diagonal_output=True, generator=g)
    eps = torch.randn(5, *fmap.shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    torch.testing.assert_close(fd, fmap + cov.diagonal(dim1=1, dim2=2).sqrt() * eps)
    ps = ours.predictive_samples(X, n_samples=5, diagonal_output=True, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ps, torch.softmax(fd, -1))
    nn_s = ours.functional_samples(X, pred_type="nn", n_samples=3, generator=torch.Generator().manual_seed(1))
    thetas = ours.sample(3, generator=torch.Generator().manual_seed(1))
    ref = torch.stack([model_fn(model, ours)(t, X) for t in thetas])
    torch.testing.assert_close(nn_s, ref)


def test_compat_factory_backends_and_keywords():
    model = mlp(d_out=2)
    X, y = _data()
    la = compat.Laplace(model, "regression", "all", "diag", backend=compat.CurvlinopsEF)
    assert isinstance(la, compat.DiagLaplace) and la.curvature == "ef"
    ref = Laplace(model, "regression", "all", "diag", curvature="ef")
    la.fit(loader(X, y), progress_bar=True)
    ref.fit(loader(X, y))
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood())
    assert isinstance(compat.Laplace(model, "classification"), compat.KronLLLaplace)
    with pytest.raises(ValueError, match="backend"):
        compat.Engine(model, "regression", backend="hessian")
    with pytest.raises(ValueError, match="contradicts"):
        compat.Engine(model, "regression", backend=compat.AsdlEF, curvature="mc_fisher")
    with pytest.raises(ValueError, match="backend_kwargs"):
        compat.Engine(model, "regression", backend_kwargs={"stochastic": True})
    with pytest.raises(ValueError, match="feature_reduction"):
        compat.Engine(model, "regression", feature_reduction="max")


@pytest.mark.parametrize("option,value", [("sigma_noise", torch.ones(1, 1)), ("sigma_noise", "1.2"),
                                          ("prior_precision", torch.ones(1, 1)), ("prior_precision", "1.5"),
                                          ("prior_mean", torch.ones(1, 1))])
def test_validation_like_laplace_torch(option, value):
    with pytest.raises(ValueError, match=option):
        Laplace(mlp(d_out=2), "regression", **{option: value})


def test_diag_prior_alias_and_lazy_full_H():
    model = mlp(d_out=2)
    la = Laplace(model, "regression", "all", "full", prior_structure="diag")
    assert la.prior_structure == "diagonal" and la.H is None  # no [P, P] allocation before fit
    la.fit(loader(*_data()))
    assert la.H.shape == (la.n_params, la.n_params)


class _DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(d_out=2)

    def forward(self, batch, scale: float = 1.0):
        return self.net(batch["x"]) * scale


def test_dict_batches_and_model_kwargs():
    X, y = _data()
    dm = _DictModel()
    la = compat.Engine(dm, "regression", "all", "kron", dict_key_y="target")
    la.fit([UserDict({"x": X[:6], "target": y[:6]}), UserDict({"x": X[6:], "target": y[6:]})])
    ref = Laplace(dm.net, "regression", "all", "kron")
    ref.fit(loader(X, y, 6))
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood())
    # dict inputs to the predictive (one chunk): same as the tensor model's
    m_d, v_d = la(UserDict({"x": X}), diagonal_output=True)
    m_t, v_t = ref(X, diagonal_output=True)
    torch.testing.assert_close(m_d, m_t)
    torch.testing.assert_close(v_d, v_t)
    g = torch.Generator().manual_seed(0)
    n_d = la(UserDict({"x": X}), pred_type="nn", link_approx="mc", n_samples=4, generator=g)[0]
    n_t = ref(X, pred_type="nn", link_approx="mc", n_samples=4, generator=torch.Generator().manual_seed(0))[0]
    torch.testing.assert_close(n_d, n_t)
    with pytest.raises(KeyError, match="dict_key_y"):
        Laplace(dm, "regression", "all", "kron").fit([UserDict({"x": X, "target": y})])
    # keyword arguments of la(x, ...) reach the model's forward: scale 2 doubles mean and Jacobians
    m1, v1 = ref(X, diagonal_output=True)
    la2 = Laplace(_ScaledNet(dm.net), "regression", "all", "kron")
    la2.fit(loader(X, y, 6))
    ms, vs = la2(X, diagonal_output=True, scale=1.0)
    torch.testing.assert_close(ms, m1)
    torch.testing.assert_close(vs, v1)
    mt, _ = la2(X, diagonal_output=True, scale=2.0)
    torch.testing.assert_close(mt, 2 * m1)


class _ScaledNet(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, scale: float = 1.0):
        return self.net(x) * scale


def test_last_layer_nn_predictive_is_differentiable_in_x():
    """A bug found making the engine a drop-in: the captured last-layer input was detached. The nn predictive mean is
    ``mean_s (phi(x) W_s^T + b_s)``; its gradient w.r.t. x equals that of the explicit formula."""
    model, X, la, _ = _pair("regression", "last_layer", "full")
    x = X[:5].clone().requires_grad_(True)
    m, v = la(x, pred_type="nn", link_approx="mc", n_samples=7, generator=torch.Generator().manual_seed(2))
    gx = torch.autograd.grad(m.sum() + v.sum(), x)[0]
    thetas = la.sample(7, generator=torch.Generator().manual_seed(2))
    x2 = X[:5].clone().requires_grad_(True)
    phi = model[:-1](x2)
    W, b = thetas[:, :-2].reshape(7, 2, -1), thetas[:, -2:]
    fs = torch.einsum("ni,soi->sno", phi, W) + b[:, None]
    ref = torch.autograd.grad(fs.mean(0).sum() + fs.var(0).sum(), x2)[0]
    assert gx.abs().sum() > 0
    torch.testing.assert_close(gx, ref)


def test_regression_call_is_noise_free_and_predictor_adds_it():
    from laplace_lab.config.schema import PredictiveConfig
    from laplace_lab.training.predictors import laplace_predictor

    _, X, la, _ = _pair("regression", "all", "kron")
    m, fvar = la(X, diagonal_output=True)
    parts = la(X, return_parts=True)
    torch.testing.assert_close(parts.var, fvar + la.sigma_noise**2)
    pm, pv = laplace_predictor(la, PredictiveConfig(pred_type="glm", link_approx="probit", n_samples=10))(X)
    torch.testing.assert_close(pv, parts.var)
    assert math.isclose(float(la.sigma_noise), 0.7)


@pytest.mark.parametrize("method", ["marglik", "gridsearch"])
def test_optimize_prior_precision_signature_matches(method):
    model, X, ours, theirs = _pair("classification", "all", "kron")
    kw = dict(method=method, init_prior_prec=1.0, n_steps=30, lr=0.1, val_loader=loader(X, ours_y(X, model)),
              grid_size=9, log_prior_prec_min=-2, log_prior_prec_max=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.optimize_prior_precision("glm", **kw)
    ours.optimize_prior_precision("glm", **kw)
    torch.testing.assert_close(ours.prior_precision, theirs.prior_precision.reshape(-1), rtol=1e-5, atol=0)


def ours_y(X, model):
    return model(X).detach().argmax(-1)


def test_gridsearch_regression_glm_counts_the_noise():
    """The validation NLL of the regression glm predictive uses f_var + sigma^2 (la(x) itself is noise-free)."""
    _, X, la, _ = _pair("regression", "all", "diag")
    Xv, yv = _data(n=8, seed=5)
    grid = [0.01, 1.0, 100.0]
    nlls = []
    for v in grid:
        la.prior_precision = v
        m, var = la(Xv, diagonal_output=True)
        var = var + la.sigma_noise**2
        nlls.append(float(0.5 * ((yv - m).square() / var + torch.log(2 * math.pi * var)).sum()))
    la.optimize_prior_precision("glm", method="gridsearch", val_loader=loader(Xv, yv), grid=grid)
    assert float(la.prior_precision) == grid[nlls.index(min(nlls))]
    with pytest.raises(ValueError, match="loss"):
        la.optimize_prior_precision("glm", method="gridsearch", val_loader=loader(Xv, yv), loss=lambda a, b: 0)
