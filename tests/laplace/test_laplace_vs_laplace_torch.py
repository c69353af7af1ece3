"""Log marginal likelihood vs laplace-torch (default curvlinops backend), one full batch, float64.

Documented deviations of the peer that the tests account for:
- EF for regression: laplace-torch squares gradients of the sum-MSE loss and multiplies by 1/2,
  i.e. ``H_EF = 2 sum J^T r r^T J``; ours is the EF of the unit-noise Gaussian NLL,
  ``sum J^T r r^T J`` (consistent with the GGN and with the MC Fisher's expectation). We check
  that factor exactly instead of the marglik.
- last-layer diag EF: the curvlinops backend of laplace-torch 0.3 returns zeros; BackPACK is used.
- last-layer layerwise priors: laplace-torch only accepts scalar/diagonal there, so it gets the
  expanded per-parameter prior (full/diag); last-layer kron + layerwise has no peer.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from laplace_refs import cnn, data, loader, mlp

from laplace_lab.laplace import Laplace

laplace_torch = pytest.importorskip("laplace")


def _pair(model, lik, X, y, peer_prior=None, **kw):
    sigma = 0.7 if lik == "regression" else 1.0
    ours = Laplace(model, lik, sigma_noise=sigma, **kw)
    kw_lt = {k: v for k, v in kw.items() if k not in ("curvature", "prior_structure")}
    if peer_prior is not None:
        kw_lt["prior_precision"] = peer_prior
    backend = None
    if kw.get("curvature") == "ef":
        from laplace.curvature import BackPackEF, CurvlinopsEF

        last_diag = kw.get("subset_of_weights") == "last_layer" and kw.get("hessian_structure") == "diag"
        backend = BackPackEF if last_diag else CurvlinopsEF
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = laplace_torch.Laplace(model, lik, sigma_noise=sigma, backend=backend, **kw_lt)
        dl = loader(X, y)
        ours.fit(dl)
        theirs.fit(dl)
    return ours, theirs


def _dense_H(la_ours, theirs, structure, factor):
    """Curvature (without prior) as dense matrices: ours scaled by ``factor``, theirs as stored."""
    one = torch.ones((), dtype=torch.float64)
    ours = la_ours.structure.dense_precision(factor * one, torch.zeros(1, dtype=torch.float64))
    if structure == "full":
        return ours, theirs.H
    if structure == "diag":
        return ours, torch.diag(theirs.H)
    return ours, theirs.H.to_matrix()


@pytest.mark.parametrize("lik", ["classification", "regression"])
@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("curv", ["ggn", "ef"])
@pytest.mark.parametrize("prior", ["scalar", "layerwise"])
def test_marglik_matches_laplace_torch(lik, structure, subset, curv, prior):
    if subset == "last_layer" and structure == "kron" and prior == "layerwise":
        pytest.skip("laplace-torch 0.3 has no layerwise prior for last-layer Laplace")
    model = mlp(d_out=3 if lik == "classification" else 2)
    X, y = data("mlp", lik, n=20, d_out=3 if lik == "classification" else 2)
    n_layers = 2 if subset == "last_layer" else 6
    pp = torch.linspace(0.5, 2.0, n_layers, dtype=torch.float64) if prior == "layerwise" else 1.3
    peer_prior = None
    if subset == "last_layer" and prior == "layerwise":
        last = model[-1]
        peer_prior = torch.cat([pp[0].repeat(last.weight.numel()), pp[1].repeat(last.bias.numel())])
    ours, theirs = _pair(model, lik, X, y, peer_prior=peer_prior, subset_of_weights=subset,
                         hessian_structure=structure, curvature=curv, prior_precision=pp)
    if curv == "ef" and lik == "regression":
        a, b = _dense_H(ours, theirs, structure, factor=2.0)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
        return
    a, b = ours.log_marginal_likelihood(), theirs.log_marginal_likelihood()
    torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-4, atol=0)
    terms = ours.log_marginal_likelihood_terms()  # and its terms, under laplace-torch's names
    for name in ("log_likelihood", "log_det_ratio", "scatter"):
        a, b = getattr(ours, name), getattr(theirs, name)
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-4, atol=1e-8)
        torch.testing.assert_close(terms[{"log_likelihood": "log_lik"}.get(name, name)], a)
    a, b = _dense_H(ours, theirs, structure, factor=1.0)  # same curvature, not only the same number
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("prior", ["scalar", "layerwise"])
def test_marglik_matches_laplace_torch_cnn(structure, prior):
    model = cnn()
    X, y = data("cnn", "classification", n=16)
    pp = torch.linspace(0.5, 2.0, 6, dtype=torch.float64) if prior == "layerwise" else 0.9
    ours, theirs = _pair(model, "classification", X, y, subset_of_weights="all",
                         hessian_structure=structure, prior_precision=pp)
    a, b = ours.log_marginal_likelihood(), theirs.log_marginal_likelihood()
    torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-4, atol=0)
