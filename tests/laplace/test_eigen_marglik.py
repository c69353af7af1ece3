"""``EigenMarglik``: the log marglik of kron / diag fits from eigenvalues taken once, and its
closed-form gradient, equal ``Laplace.log_marginal_likelihood`` and its autograd gradient (float64);
``FullMarglik`` the same for full fits (one Cholesky per call)."""

from __future__ import annotations

import pytest
import torch
from laplace_refs import cnn, data, mlp

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.eigen_marglik import (
    EigenMarglik,
    FullMarglik,
    closed_form,
    supports,
    supports_full,
)

CASES = [  # (structure, prior structure, number of prior values)
    ("kron", "scalar", 1), ("kron", "layerwise", None), ("kron", "normgroups", 2),
    ("diag", "scalar", 1), ("diag", "layerwise", None), ("diag", "diagonal", "P"),
    ("full", "scalar", 1), ("full", "layerwise", None), ("full", "normgroups", 2), ("full", "diagonal", "P"),
]


def _fit(kind, lik, structure, prior_structure, curvature="ggn"):
    model = mlp(d_out=2 if lik == "regression" else 3) if kind == "mlp" else cnn(d_out=3)
    X, y = data(kind, lik, n=14, d_out=2 if lik == "regression" else 3)
    kw = {}
    if prior_structure == "normgroups":
        kw["prior_groups"] = torch.tensor([i % 2 for i in range(len(list(model.parameters())))])
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure=structure, curvature=curvature,
                 prior_structure=prior_structure, sigma_noise=0.7 if lik == "regression" else 1.0,
                 prior_mean=0.05, **kw)
    la.fit([(X[:8], y[:8]), (X[8:], y[8:])])
    return la


def _log_values(la, n):
    n = {None: la.n_layers, "P": la.n_params}.get(n, n)
    return torch.linspace(-1.5, 2.0, n, dtype=torch.float64)


@pytest.mark.parametrize("structure,prior_structure,n", CASES)
@pytest.mark.parametrize("kind,lik", [("mlp", "classification"), ("mlp", "regression"), ("cnn", "classification")])
def test_value_and_gradient_equal_the_engine(kind, lik, structure, prior_structure, n):
    la = _fit(kind, lik, structure, prior_structure)
    assert (supports_full if structure == "full" else supports)(la)
    em = closed_form(la)  # checks itself against la at the current values
    assert type(em) is (FullMarglik if structure == "full" else EigenMarglik)
    log_prior = _log_values(la, n).requires_grad_(True)
    log_sigma = torch.tensor(-0.3, dtype=torch.float64, requires_grad=True) if lik == "regression" else None
    sigma = log_sigma.exp() if log_sigma is not None else None
    ref = la.log_marginal_likelihood(prior_precision=log_prior.exp(), sigma_noise=sigma)
    ref_grads = torch.autograd.grad(ref, [p for p in (log_prior, log_sigma) if p is not None])
    mine = em(log_prior.exp(), None if log_sigma is None else log_sigma.exp())
    torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-10)
    g_prior, g_sigma = em.grad_log(log_prior, log_sigma)
    torch.testing.assert_close(g_prior, ref_grads[0], rtol=1e-10, atol=1e-10)
    if log_sigma is not None:
        torch.testing.assert_close(g_sigma, ref_grads[1], rtol=1e-10, atol=1e-10)
    else:
        assert g_sigma is None


def test_scalar_value_for_a_grouped_prior_gets_the_summed_gradient():
    la = _fit("mlp", "classification", "kron", "layerwise")
    em = EigenMarglik(la)
    lp = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)
    ref = la.log_marginal_likelihood(prior_precision=lp.exp().expand(la.n_layers))
    torch.testing.assert_close(em.grad_log(lp)[0], torch.autograd.grad(ref, lp)[0], rtol=1e-10, atol=1e-10)


def test_unsupported_fits_and_a_disagreeing_engine_are_refused():
    la = _fit("mlp", "classification", "full", "scalar")
    assert not supports(la)
    with pytest.raises(ValueError, match="kron"):
        EigenMarglik(la)
    with pytest.raises(ValueError, match="full"):
        FullMarglik(_fit("mlp", "classification", "kron", "scalar"))
    em = EigenMarglik(_fit("mlp", "classification", "kron", "scalar"), check=False)
    em.h = em.h * 3  # as if an engine convention changed: the self-check refuses
    with pytest.raises(ValueError, match="disagrees"):
        em.verify(1e-10)
