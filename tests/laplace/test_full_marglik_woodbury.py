"""``FullMarglik``'s eigenbasis + Woodbury inverse diagonal (one eigendecomposition per fit, then
``O(P^2 r)`` per step) equals a dense float64 inverse and the engine's autograd gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.eigen_marglik import FullMarglik


def _fit(lik, prior_structure, d_in=20, width=30):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d_in, width), nn.Tanh(), nn.Linear(width, 2)).double()
    X = torch.randn(40, d_in, dtype=torch.float64)
    y = torch.randn(40, 2, dtype=torch.float64) if lik == "regression" else torch.randint(0, 2, (40,))
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure="full", prior_structure=prior_structure,
                 sigma_noise=0.7 if lik == "regression" else 1.0, prior_mean=0.05)
    la.fit([(X[:20], y[:20]), (X[20:], y[20:])])
    return la


def _dense_inverse_diag(la, delta, sigma):
    """``diag((c H + P0)^{-1})`` from the dense float64 ``H``; ``delta`` per parameter tensor (layerwise)
    or one value (scalar); ``c = 1 / sigma^2`` (regression) or 1."""
    c = 1.0 if sigma is None else 1.0 / sigma.square()
    per_param = torch.cat([d.expand(p.numel()) for d, p in zip(delta.expand(len(la.params)), la.params)])
    return torch.linalg.inv(c * la.H + torch.diag(per_param)).diagonal()


@pytest.mark.parametrize("lik", ["classification", "regression"])
@pytest.mark.parametrize("log_prior", [[-1.5, 0.3, 2.0, -0.2], [-4.0, 4.0, -4.0, 4.0], [4.0, -4.0, 0.0, 1.0],
                                       [0.5, 0.5, 0.5, 0.5]])
def test_layerwise_equals_dense_and_autograd(lik, log_prior):
    la = _fit(lik, "layerwise")
    fm = FullMarglik(la)
    assert fm.low_rank == 92  # the first weight holds 600 of 692 parameters
    delta = torch.tensor(log_prior, dtype=torch.float64).exp()
    for sigma in ((None,) if lik == "classification" else (torch.tensor(0.7, dtype=torch.float64),
                                                           torch.tensor(1.6, dtype=torch.float64))):
        torch.testing.assert_close(fm.inverse_diagonal(delta, sigma), _dense_inverse_diag(la, delta, sigma),
                                   rtol=1e-10, atol=1e-12)
    lp = torch.tensor(log_prior, dtype=torch.float64, requires_grad=True)
    ls = torch.tensor(-0.3, dtype=torch.float64, requires_grad=True) if lik == "regression" else None
    ref = la.log_marginal_likelihood(prior_precision=lp.exp(), sigma_noise=None if ls is None else ls.exp())
    ref_grads = torch.autograd.grad(ref, [t for t in (lp, ls) if t is not None])
    g_prior, g_sigma = fm.grad_log(lp, ls)
    torch.testing.assert_close(g_prior, ref_grads[0], rtol=1e-10, atol=1e-10)
    if ls is not None:
        torch.testing.assert_close(g_sigma, ref_grads[1], rtol=1e-10, atol=1e-10)


def test_scalar_prior_is_the_plain_eigenbasis():
    la = _fit("classification", "scalar")
    fm = FullMarglik(la)
    assert fm.low_rank == 0
    delta = torch.tensor([2.5], dtype=torch.float64)
    torch.testing.assert_close(fm.inverse_diagonal(delta), _dense_inverse_diag(la, delta, None),
                               rtol=1e-10, atol=1e-12)


def test_balanced_groups_keep_the_cholesky():
    la = _fit("classification", "layerwise", d_in=2, width=30)  # largest group 60 of 152: r > P / 2
    fm = FullMarglik(la)
    assert fm.low_rank is None
    delta = torch.tensor([0.3, 1.0, 2.0, 5.0], dtype=torch.float64)
    torch.testing.assert_close(fm.inverse_diagonal(delta), _dense_inverse_diag(la, delta, None),
                               rtol=1e-10, atol=1e-12)


def test_an_indefinite_precision_falls_back_and_raises():
    fm = FullMarglik(_fit("classification", "layerwise"))
    assert fm.low_rank is not None
    with pytest.raises(torch.linalg.LinAlgError):  # negative precision: not positive definite
        fm.inverse_diagonal(torch.tensor([-5.0, 1.0, 1.0, 1.0], dtype=torch.float64))
