"""Predictive vs laplace-torch 0.3 (default curvlinops backend) on the same model, data and
posterior, float64, GGN (our regression EF is half of laplace-torch's, see
test_laplace_vs_laplace_torch). laplace-torch's regression variance excludes the noise."""

from __future__ import annotations

import warnings

import pytest
import torch
from laplace_refs import cnn, data, loader, mlp

from laplace_lab.laplace import Laplace

laplace_torch = pytest.importorskip("laplace")


def _pair(model, lik, X, y, **kw):
    sigma = 0.7 if lik == "regression" else 1.0
    ours = Laplace(model, lik, sigma_noise=sigma, prior_precision=0.8, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = laplace_torch.Laplace(model, lik, sigma_noise=sigma, prior_precision=0.8, **kw)
        dl = loader(X, y)
        ours.fit(dl)
        theirs.fit(dl)
    return ours, theirs


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("link", ["probit", "bridge", "bridge_norm"])
def test_classification_probs_match(structure, subset, link):
    model = mlp()
    X, y = data("mlp", "classification", n=20)
    ours, theirs = _pair(model, "classification", X, y, subset_of_weights=subset,
                         hessian_structure=structure)
    Xt, _ = data("mlp", "classification", n=15, seed=4)
    a = ours(Xt, link_approx=link)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = theirs(Xt, pred_type="glm", link_approx=link)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("link", ["probit", "bridge"])
def test_classification_probs_match_cnn(structure, link):
    model = cnn()
    X, y = data("cnn", "classification", n=16)
    ours, theirs = _pair(model, "classification", X, y, subset_of_weights="all", hessian_structure=structure)
    Xt, _ = data("cnn", "classification", n=10, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = theirs(Xt, pred_type="glm", link_approx=link)
    torch.testing.assert_close(ours(Xt, link_approx=link), b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_regression_moments_match(structure, subset):
    model = mlp(d_out=2)
    X, y = data("mlp", "regression", n=20, d_out=2)
    ours, theirs = _pair(model, "regression", X, y, subset_of_weights=subset, hessian_structure=structure)
    Xt, _ = data("mlp", "regression", n=15, d_out=2, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m_b, cov_b = theirs(Xt, pred_type="glm")
    m_a, cov_a = ours(Xt)  # same convention: functional covariance [B, C, C], no noise
    torch.testing.assert_close(m_a, m_b, rtol=0, atol=1e-8)
    torch.testing.assert_close(cov_a, cov_b, rtol=1e-6, atol=1e-9)
