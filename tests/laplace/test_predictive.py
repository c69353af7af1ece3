"""Predictive: functional variance against dense float64 ``J Sigma J^T`` (torch.func
Jacobians, dense posterior covariance), links, regression parts, gradients w.r.t. the input,
sampling predictives (statistical tests with fixed seeds) and the API's errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from laplace_refs import cnn, data, dense_jacobian, loader, mlp, model_fn
from torch import nn
from torch.func import jacrev

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.predictive import RegressionPredictive, glm_moments

LIKS = ["classification", "regression", "heteroscedastic_regression"]


def _fit(model, lik, X, y, structure, subset, prior=0.7, **kw):
    la = Laplace(model, lik, subset_of_weights=subset, hessian_structure=structure, prior_precision=prior,
                 sigma_noise=0.8 if lik == "regression" else 1.0, **kw)
    la.fit(loader(X, y))
    return la


def _dense_sigma(la):
    return torch.linalg.inv(la.structure.dense_precision(la.H_factor, la.prior_precision))


def _dense_fvar(model, la, X):
    J = dense_jacobian(model, la, X)
    return J @ _dense_sigma(la) @ J.transpose(1, 2)


def _setup(kind, lik, structure, subset, prior=0.7):
    d_out = 3 if lik == "classification" else 4
    model = (mlp if kind == "mlp" else cnn)(d_out=d_out)
    X, y = data(kind, lik, n=10, d_out=d_out)
    return model, X, _fit(model, lik, X, y, structure, subset, prior)


# ------------------------------------------------------------------------ functional variance
@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_functional_variance_matches_dense(kind, lik, structure, subset):
    n_layers = 2 if subset == "last_layer" else 6
    prior = torch.linspace(0.3, 2.0, n_layers, dtype=torch.float64) if structure != "full" else 0.7
    model, X, la = _setup(kind, lik, structure, subset, prior)
    ref = _dense_fvar(model, la, X)
    # small chunks and a tiny block budget exercise the chunked / sub-chunked paths
    f, fvar = glm_moments(la, X, chunk_size=4, budget=50)
    torch.testing.assert_close(fvar, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(f, model(X).reshape(len(X), -1).detach())
    _, fdiag = glm_moments(la, X, diag=True)
    torch.testing.assert_close(fdiag, ref.diagonal(dim1=1, dim2=2), rtol=1e-9, atol=1e-12)


class _Odd(nn.Module):
    """Linear on 3-d input (S = 2 rows per datum), LayerNorm (diagonal block), a Linear called
    twice (weight sharing across calls) and a BatchNorm1d in eval mode."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.norm = nn.LayerNorm(4)
        self.shared = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.norm(self.lin(x)))
        h = torch.tanh(self.shared(torch.tanh(self.shared(h))))
        return self.out(torch.tanh(self.bn(h.flatten(1))))


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_functional_variance_matches_dense_odd_modules(structure):
    torch.manual_seed(0)
    model = _Odd().double()
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    X = torch.randn(9, 2, 3, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    la = _fit(model, "classification", X, y, structure, "all")
    _, fvar = glm_moments(la, X, chunk_size=4, budget=20)
    torch.testing.assert_close(fvar, _dense_fvar(model, la, X), rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- predictive values
@pytest.mark.parametrize("structure", ["full", "kron"])
def test_regression_predictive_is_fvar_plus_noise(structure):
    model, X, la = _setup("mlp", "regression", structure, "all")
    ref = _dense_fvar(model, la, X)
    s2 = la.sigma_noise**2
    mean, fcov = la(X)  # laplace-torch's convention: the functional covariance, no noise
    torch.testing.assert_close(mean, model(X).detach())
    torch.testing.assert_close(fcov, ref)
    mean, fvar = la(X, diagonal_output=True)
    torch.testing.assert_close(fvar, ref.diagonal(dim1=1, dim2=2))
    parts = la(X, joint_outputs=True, return_parts=True)
    torch.testing.assert_close(parts.var, ref + s2 * torch.eye(4, dtype=torch.float64))
    parts = la(X, return_parts=True)
    torch.testing.assert_close(parts.var, ref.diagonal(dim1=1, dim2=2) + s2)
    assert isinstance(parts, RegressionPredictive)
    torch.testing.assert_close(parts.epistemic, ref.diagonal(dim1=1, dim2=2))
    torch.testing.assert_close(parts.aleatoric, s2.expand(len(X), 4))
    m_map = la(X, pred_type="map", return_parts=True)
    torch.testing.assert_close(m_map.var, s2.expand(len(X), 4))


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_heteroscedastic_parts_are_the_linearised_mean_and_map_noise(structure, subset):
    model, X, la = _setup("mlp", "heteroscedastic_regression", structure, subset)
    f = model_fn(model, la)

    def mean_var(theta):
        out = f(theta, X)
        eta1, eta2 = out[:, :2], -F.softplus(out[:, 2:])
        return -eta1 / (2 * eta2), -1 / (2 * eta2)

    Jm = jacrev(lambda th: mean_var(th)[0])(la.mean)  # [N, D, P]
    epi_ref = Jm @ _dense_sigma(la) @ Jm.transpose(1, 2)
    m_ref, alea_ref = mean_var(la.mean)
    out = la(X, return_parts=True)
    torch.testing.assert_close(out.mean, m_ref)
    torch.testing.assert_close(out.aleatoric, alea_ref)
    torch.testing.assert_close(out.epistemic, epi_ref.diagonal(dim1=1, dim2=2))
    torch.testing.assert_close(out.var, alea_ref + out.epistemic)
    mean, var = la(X)  # default return stays (mean, var)
    torch.testing.assert_close(var, out.var)
    joint = la(X, joint_outputs=True, return_parts=True)
    torch.testing.assert_close(joint.epistemic, epi_ref)
    torch.testing.assert_close(joint.var, epi_ref + torch.diag_embed(alea_ref))
    m_map, v_map = la(X, pred_type="map")
    torch.testing.assert_close(v_map, alea_ref)


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_heteroscedastic_natural_linearises_eta1_alone(structure):
    """het_approx='natural' (Immer et al. 2023's reported predictive): mean and aleatoric part as
    'mean', epistemic = s^2 J_eta1 Sigma J_eta1^T with s = -1 / (2 eta2) at the MAP (dense float64)."""
    model, X, la = _setup("mlp", "heteroscedastic_regression", structure, "all")
    f = model_fn(model, la)
    J1 = jacrev(lambda th: f(th, X)[:, :2])(la.mean)  # eta1's Jacobian [N, D, P]
    out_map = f(la.mean, X)
    s = -1 / (2 * -F.softplus(out_map[:, 2:]))
    epi_ref = s[:, :, None] * (J1 @ _dense_sigma(la) @ J1.transpose(1, 2)) * s[:, None, :]
    natural = la(X, return_parts=True, het_approx="natural")
    mean = la(X, return_parts=True)
    torch.testing.assert_close(natural.mean, mean.mean)
    torch.testing.assert_close(natural.aleatoric, mean.aleatoric)
    torch.testing.assert_close(natural.epistemic, epi_ref.diagonal(dim1=1, dim2=2))
    assert not torch.allclose(natural.epistemic, mean.epistemic)  # the two closed forms differ
    joint = la(X, joint_outputs=True, return_parts=True, het_approx="natural")
    torch.testing.assert_close(joint.epistemic, epi_ref)


def test_het_approx_is_checked():
    model, X, la = _setup("mlp", "heteroscedastic_regression", "full", "all")
    with pytest.raises(ValueError, match="het_approx must be one of"):
        la(X, het_approx="eta2")
    with pytest.raises(ValueError, match="closed form of the glm predictive"):
        la(X, link_approx="mc", het_approx="natural")
    _, Xr, la_r = _setup("mlp", "regression", "full", "all")
    with pytest.raises(ValueError, match="needs likelihood='heteroscedastic_regression'"):
        la_r(Xr, het_approx="natural")


def _probit_ref(f, fvar):
    return torch.softmax(f / torch.sqrt(1 + math.pi / 8 * fvar.diagonal(dim1=1, dim2=2)), -1)


@pytest.mark.parametrize("structure, subset, kind", [("kron", "all", "cnn"), ("diag", "all", "mlp"),
                                                     ("full", "last_layer", "mlp"), ("kron", "last_layer", "cnn"),
                                                     ("full", "all", "cnn")])
def test_probit_predictive_is_differentiable_in_x(structure, subset, kind):
    model, X, la = _setup(kind, "classification", structure, subset)
    Sigma = _dense_sigma(la)
    f_theta = model_fn(model, la)
    w = torch.randn(len(X), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def ref(x):
        J = jacrev(lambda th: f_theta(th, x))(la.mean).reshape(len(x), 3, -1)
        return _probit_ref(f_theta(la.mean, x), J @ Sigma @ J.transpose(1, 2))

    x1 = X.clone().requires_grad_(True)
    (g_ours,) = torch.autograd.grad((la(x1, chunk_size=4).log() * w).sum(), x1)
    x2 = X.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad((ref(x2).log() * w).sum(), x2)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(la(X), ref(X).detach())  # detached fast path, same values


def test_map_and_model_state_untouched():
    model, X, la = _setup("cnn", "classification", "kron", "all")
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    torch.testing.assert_close(la(X, pred_type="map"), torch.softmax(model.eval()(X), -1).detach())
    model.train()
    la(X, pred_type="nn", link_approx="mc", n_samples=3)
    la(X)
    assert model.training
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)


# ------------------------------------------------------------------------------ sampling tests
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_nn_predictive_is_average_over_posterior_samples(subset):
    model, X, la = _setup("cnn", "classification", "kron", subset)
    S = 7
    probs = la(X, pred_type="nn", link_approx="mc", n_samples=S, chunk_size=4, generator=torch.Generator().manual_seed(5))
    thetas = la.sample(S, generator=torch.Generator().manual_seed(5))
    f = model_fn(model, la)
    ref = torch.stack([torch.softmax(f(t, X), -1) for t in thetas]).mean(0).detach()
    torch.testing.assert_close(probs, ref)


def test_mc_link_converges_to_closed_form_regression():
    """glm + mc: sample mean -> f_MAP with standard error sqrt(var / S); sample variance -> var
    with relative standard error sqrt(2 / (S - 1)). 5-sigma tolerances, fixed seed."""
    model, X, la = _setup("mlp", "regression", "kron", "all")
    mean, fvar = la(X, diagonal_output=True)  # functional variance (no noise), laplace-torch's convention
    for S in (100, 2000, 20000):
        m, v = la(X, link_approx="mc", n_samples=S, generator=torch.Generator().manual_seed(S), diagonal_output=True)
        assert ((m - mean).abs() <= 5 * (fvar / S).sqrt()).all()
        assert ((v - fvar).abs() <= 5 * math.sqrt(2 / (S - 1)) * fvar + 1e-12).all()


def test_mc_link_converges_to_glm_classification():
    """glm + mc vs E[softmax(f)] under N(f_MAP, J Sigma J^T) from 4e5 independent draws of the
    dense reference; tolerance 5 standard errors of each Monte-Carlo estimate."""
    model, X, la = _setup("mlp", "classification", "diag", "all", prior=0.3)
    f = model(X).detach()
    L = torch.linalg.cholesky(_dense_fvar(model, la, X))
    g = torch.Generator().manual_seed(0)
    ref_s = torch.softmax(f + torch.einsum("bij,sbj->sbi", L, torch.randn(400000, *f.shape, generator=g,
                                                                           dtype=f.dtype)), -1)
    ref, sd = ref_s.mean(0), ref_s.std(0)
    assert (sd > 1e-3).any()  # the posterior is not degenerate
    errs = []
    for S in (100, 1000, 10000):
        p = la(X, link_approx="mc", n_samples=S, generator=torch.Generator().manual_seed(S))
        err = (p - ref).abs()
        assert (err <= 5 * sd * math.sqrt(1 / S + 1 / 400000) + 1e-12).all()
        errs.append(err.max())
    assert errs[-1] < errs[0]


@pytest.mark.parametrize("lik", ["regression", "heteroscedastic_regression"])
def test_last_layer_nn_predictive_converges_to_glm(lik):
    """For the last layer the network is linear in the sampled weights, so the nn predictive is
    the GLM predictive: mean within 5 standard errors."""
    model, X, la = _setup("mlp", lik, "full", "last_layer")
    S = 20000
    if lik == "regression":
        mean, fvar = la(X, diagonal_output=True)
        m, v = la(X, pred_type="nn", link_approx="mc", n_samples=S, generator=torch.Generator().manual_seed(1))
        assert ((m - mean).abs() <= 5 * (fvar / S).sqrt()).all()
        assert ((v - fvar).abs() <= 5 * math.sqrt(2 / (S - 1)) * fvar + 1e-12).all()
    else:
        mc = la(X, link_approx="mc", n_samples=S, return_parts=True, generator=torch.Generator().manual_seed(1))
        nn_ = la(X, pred_type="nn", link_approx="mc", n_samples=S, return_parts=True, generator=torch.Generator().manual_seed(2))
        se = (mc.epistemic / S).sqrt() * math.sqrt(2)
        assert ((mc.mean - nn_.mean).abs() <= 5 * se).all()
        torch.testing.assert_close(mc.aleatoric, nn_.aleatoric, rtol=0.05, atol=0)


# ------------------------------------------------------------------------- prior optimisation
def test_gridsearch_glm_picks_min_validation_nll():
    model, X, la = _setup("mlp", "classification", "kron", "last_layer")
    Xv, yv = data("mlp", "classification", n=30, seed=7)
    grid = [0.01, 1.0, 100.0]
    nlls = []
    for v in grid:
        la.prior_precision = v
        p = la(Xv)
        nlls.append(-p.gather(1, yv[:, None]).log().sum().item())
    la.optimize_prior_precision(method="gridsearch", val_loader=loader(Xv, yv), grid=grid, pred_type="glm")
    assert la.prior_precision.item() == grid[min(range(3), key=nlls.__getitem__)]
    with pytest.raises(ValueError, match="pred_type"):
        la.optimize_prior_precision(method="gridsearch", val_loader=loader(Xv, yv), pred_type="map")


# ------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "lik, kw, option",
    [
        ("classification", {"pred_type": "exact"}, "pred_type"),
        ("classification", {"link_approx": "logit"}, "link_approx"),
        ("classification", {"pred_type": "nn", "link_approx": "probit"}, "link_approx"),
        ("regression", {"link_approx": "bridge"}, "link_approx"),
        ("classification", {"joint": True}, "joint"),
        ("regression", {"joint": True, "pred_type": "nn"}, "joint"),
        ("classification", {"return_parts": True}, "return_parts"),
        ("classification", {"n_samples": 0}, "n_samples"),
        ("classification", {"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_predictive_options_raise(lik, kw, option):
    model, X, la = _setup("mlp", lik, "diag", "last_layer")
    with pytest.raises(ValueError, match=option):
        la(X, **kw)


def test_unfitted_predictive_raises():
    la = Laplace(mlp(), "classification", subset_of_weights="all", hessian_structure="diag")
    with pytest.raises(RuntimeError, match="fit"):
        la(torch.zeros(1, 3))
