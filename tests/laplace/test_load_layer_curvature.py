"""``Structure.load_layer_curvature``: curvature computed outside the engine replaces the accumulated
one (used by ``differentiable_marglik.fit_laplace``); wrong shapes and structures without it raise."""

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace


def _fitted(structure):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    X, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
    la.fit([(X, y)])
    return la


def test_diag_loads_the_given_diagonal():
    la = _fitted("diag")
    parts = [torch.full((p.numel(),), 2.0) for p in la.params]
    la.fit_begin()
    la.structure.load_layer_curvature(parts)
    la.fit_end()
    assert torch.equal(la.structure.H, torch.full((la.n_params,), 2.0))


def test_diag_rejects_a_wrong_size():
    la = _fitted("diag")
    with pytest.raises(ValueError, match="diagonal entries for"):
        la.structure.load_layer_curvature([torch.ones(3)])


def test_kron_loads_per_layer_sums_and_checks_the_count():
    la = _fitted("kron")
    raw = [dict(part) for part in la.structure.state_dict()["raw"]]
    before, loss, n_data = la.log_marginal_likelihood().item(), la.loss, la.n_data
    la.fit_begin()  # resets the curvature and the data term
    la.structure.load_layer_curvature(raw)
    la.loss, la.n_data = loss, n_data
    la.fit_end()
    assert la.log_marginal_likelihood().item() == pytest.approx(before, rel=1e-12)
    with pytest.raises(ValueError, match="parts for"):
        la.structure.load_layer_curvature(raw[:1])


def test_full_has_no_external_curvature():
    la = _fitted("full")
    with pytest.raises(ValueError, match="does not take per-layer curvature"):
        la.structure.load_layer_curvature([])
