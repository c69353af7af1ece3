"""A posterior structure defined in this file alone (no edit elsewhere) runs fit, marglik,
the glm predictive, sampling and config validation, checked against dense float64 references.

``IsotropicStructure``: ``H ~= s I`` with ``s`` the mean of the exact GGN diagonal (from the
public kernel ``modules.diag_sq``)."""

from __future__ import annotations

import pytest
import torch
from laplace_refs import data, dense_curvature, dense_jacobian, loader, mlp

from laplace_lab.config.load import load_run_config
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.eigen_marglik import EigenMarglik
from laplace_lab.laplace.hyper import MarglikOptimizer
from laplace_lab.laplace.modules import diag_sq
from laplace_lab.laplace.predictive import probit
from laplace_lab.laplace.priors import to_diag
from laplace_lab.laplace.spec import LaplaceSpec
from laplace_lab.laplace.structures import STRUCTURES, Structure, register
from tests.conftest import compose_config

NAME = "isotropic_test"


class IsotropicStructure(Structure):
    name = NAME
    prior_structures = ("scalar", "layerwise", "diagonal")
    curvature_types = ("ggn", "ef")

    def reset(self):
        self.diag_sum = torch.zeros(self.n_params, device=self.device, dtype=self.dtype)

    def accumulate(self, records):
        parts = []
        for e, r in zip(self.entries, records):
            d = diag_sq(e.module, e.names, r.calls) if r.calls else {n: torch.zeros_like(p) for n, p in
                                                                      zip(e.names, e.params)}
            parts += [d[n].reshape(-1) for n in e.names]
        self.diag_sum += torch.cat(parts)

    @property
    def H(self):
        return self.diag_sum.mean()

    def precision(self, c, prior):
        return c * self.H + to_diag(prior, self.sizes)

    def logdet(self, c, prior):
        return self.precision(c, prior).log().sum()

    def sample(self, n, c, prior, generator=None):
        return self.randn(n, self.n_params, generator=generator) * self.precision(c, prior).rsqrt()

    def functional_variance(self, Js, c, prior):
        return torch.einsum("ncp,p,nkp->nck", Js, 1.0 / self.precision(c, prior), Js)

    def posterior_variance(self, c, prior):
        return 1.0 / self.precision(c, prior)

    def dense_precision(self, c, prior):
        return torch.diag(self.precision(c, prior))

    def curvature_eigenvalues(self):
        return self.H.expand(self.n_params)

    def state_dict(self):
        return {"diag_sum": self.diag_sum}

    def load_state_dict(self, sd):
        self.diag_sum = sd["diag_sum"].to(self.device, self.dtype)


@pytest.fixture
def registered():
    register(IsotropicStructure)
    yield
    STRUCTURES.pop(NAME)


def test_new_structure_end_to_end(registered):
    torch.manual_seed(0)
    model = mlp(d_out=3)
    X, y = data("mlp", "classification")
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=NAME,
                 prior_precision=torch.linspace(0.5, 2.0, 6, dtype=torch.float64))
    la.fit(loader(X, y, 4))
    # fit: s = mean of the dense GGN diagonal
    H = dense_curvature(model, la, X, y)
    s = H.diagonal().mean()
    torch.testing.assert_close(la.H, s)
    other = Laplace(model, "classification", subset_of_weights="all", hessian_structure=NAME, backend="capture")
    other.fit(loader(X, y, 4))  # every curvature backend feeds it (auto is the chain for this MLP)
    assert la.chain is not None and other.chain is None
    torch.testing.assert_close(other.H, s)
    # marglik against the dense formula with P = s I + diag(prior)
    prec = s + la.prior_precision_diag
    nll = torch.nn.functional.cross_entropy(model(X), y, reduction="sum").detach()
    d = la.mean
    ref = -nll - 0.5 * (prec.log().sum() - la.prior_precision_diag.log().sum() + (d * la.prior_precision_diag) @ d)
    torch.testing.assert_close(la.log_marginal_likelihood(), ref)
    # glm predictive through the default (Jacobian) posterior view
    J = dense_jacobian(model, la, X)
    fvar = torch.einsum("ncp,p,nkp->nck", J, 1.0 / prec, J)
    torch.testing.assert_close(la(X, link_approx="probit"), probit(model(X).detach(), fvar))
    # sampling: draws are mean + N(0, 1 / prec) (same generator, exact)
    z = la.sample(5, generator=torch.Generator().manual_seed(3)) - la.mean
    eps = torch.randn(5, la.n_params, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(z, eps * prec.rsqrt())
    # a gradient step on the prior works through the protocol
    log_prior = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    (-la.log_marginal_likelihood(log_prior.exp())).backward()
    assert torch.isfinite(log_prior.grad).all() and log_prior.grad.abs().sum() > 0
    # the fast marglik comes from its curvature_eigenvalues(), chosen automatically by the marglik optimiser
    la.prior_precision = torch.linspace(0.5, 2.0, 6, dtype=torch.float64)
    fast = MarglikOptimizer.closed_form(la)
    assert isinstance(fast, EigenMarglik)
    torch.testing.assert_close(fast(la.prior_precision), la.log_marginal_likelihood())
    la.optimize_prior_precision(method="marglik", n_steps=5)
    assert la.log_marginal_likelihood() > ref
    # linear-mode CG preconditioner: the protocol's default (marginal variances)
    R = torch.randn(la.n_params, 2, dtype=torch.float64)
    torch.testing.assert_close(la.structure.preconditioner(la.H_factor, la.structure_prior)(R),
                               R / (s + to_diag(la.structure_prior, la.sizes))[:, None])


def test_new_structure_in_config_validation(registered):
    LaplaceSpec(subset_of_weights="all", hessian_structure=NAME, curvature="ef", prior_structure="diagonal").validate()
    with pytest.raises(ValueError, match=rf"hessian_structure='{NAME}' needs curvature in \['ggn', 'ef'\]"):
        LaplaceSpec(hessian_structure=NAME, curvature="mc_fisher").validate()
    cfg = compose_config([f"curvature.hessian_structure={NAME}", "curvature.type=ggn", "prior=diagonal"])
    load_run_config(cfg)
    cfg = compose_config([f"curvature.hessian_structure={NAME}", "curvature.type=mc_fisher"])
    with pytest.raises(ValueError, match=r"curvature.hessian_structure='isotropic_test' needs curvature.type"):
        load_run_config(cfg)


def test_unregistered_structure_is_rejected():
    assert NAME not in STRUCTURES
    with pytest.raises(ValueError, match="hessian_structure must be one of"):
        Laplace(mlp(), "classification", hessian_structure=NAME)
