"""het_head=half_softplus (laplace_lab.models.het_head): the heteroscedastic-nn authors' NaturalHead
eta2 = -0.5 (softplus(r) + 1e-8) through the engine's likelihood, and the GGN of the authors' model
(Jacobian of the natural parameters after their head, natural-parameter Hessian), float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, jacrev

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.likelihoods import HeteroscedasticRegression
from laplace_lab.models.het_head import HalfSoftplusHead, softplus_inverse, with_het_head
from tests.laplace.laplace_refs import loader, mlp


def test_head_gives_the_authors_eta2():
    r = torch.linspace(-30, 30, 61, dtype=torch.float64)[:, None]
    f = torch.cat([torch.randn_like(r), r], 1)
    eta1, eta2, _ = HeteroscedasticRegression.natural(HalfSoftplusHead()(f))
    torch.testing.assert_close(eta1, f[:, :1])
    torch.testing.assert_close(eta2, -0.5 * (F.softplus(r) + 1e-8), rtol=1e-10, atol=0)
    y = torch.tensor([1e-8, 0.3, 5.0, 80.0], dtype=torch.float64)
    torch.testing.assert_close(F.softplus(softplus_inverse(y)), y, rtol=1e-12, atol=0)


def test_ggn_is_the_authors_natural_parameter_ggn():
    torch.manual_seed(0)
    model = with_het_head(mlp(d_out=2), "half_softplus")
    X = torch.randn(9, 3, dtype=torch.float64)
    y = torch.randn(9, 1, dtype=torch.float64)
    la = Laplace(model, "heteroscedastic_regression", subset_of_weights="all", hessian_structure="full",
                 prior_precision=1.0)
    la.fit(loader(X, y))
    names = [n for n, _ in model[0].named_parameters()]
    shapes = [p.shape for _, p in model[0].named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def natural(th):  # the authors' model output: [eta1, eta2] after NaturalHead
        params = {n: c.view(s) for n, c, s in zip(names, torch.split(th, [s.numel() for s in shapes]), shapes)}
        out = functional_call(model[0], params, (X,))
        return torch.stack([out[:, 0], -0.5 * (F.softplus(out[:, 1]) + 1e-8)], 1)

    J = jacrev(natural)(theta)  # [N, 2, P]
    eta = natural(theta).detach()
    m, s = -eta[:, 0] / (2 * eta[:, 1]), -1 / (2 * eta[:, 1])
    H = torch.stack([torch.stack([s, 2 * m * s], -1), torch.stack([2 * m * s, 4 * m**2 * s + 2 * s**2], -1)], -2)
    ggn_ref = torch.einsum("ncp,ncd,ndq->pq", J, H, J)
    P = la.structure.dense_precision(la.H_factor, la.prior_precision)
    torch.testing.assert_close(P - torch.eye(len(theta), dtype=P.dtype), ggn_ref, rtol=1e-8, atol=1e-10)


def test_unknown_head_is_rejected():
    with pytest.raises(ValueError, match=r"het_head='exp' is not supported; allowed: \['softplus', 'half_softplus'\]"):
        with_het_head(mlp(), "exp")
