"""``priors.Prior``: the one prior object of the MAP module and Laplace. Expansions and the MAP penalty
equal the explicit float64 formulas they replaced (per-tensor squared norms, ``repeat_interleave``
over tensor sizes, group means and ``values[groups]``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.priors import Prior
from laplace_lab.training.hyperparameters import initial_log_prior, write_prior
from laplace_lab.training.module import MAPModule, MAPOptimisation

SIZES = [6, 3, 4, 2, 5]
GROUPS = torch.tensor([1, 1, 0, 3, 3])  # group 2 empty


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, generator=g, dtype=torch.float64) for n in SIZES]


@pytest.mark.parametrize("structure", ["scalar", "layerwise", "diagonal", "normgroups"])
def test_expansions_and_penalty_equal_the_explicit_formulas(structure):
    prior = Prior(structure, SIZES, GROUPS if structure == "normgroups" else None)
    n = {"scalar": 1, "layerwise": 5, "diagonal": sum(SIZES), "normgroups": 4}[structure]
    assert prior.n_values == n
    values = torch.linspace(0.3, 2.0, n, dtype=torch.float64)
    sizes = torch.tensor(SIZES)
    if structure == "diagonal":
        per_param = values
    else:
        per_tensor = {"scalar": lambda: values.expand(5), "layerwise": lambda: values,
                      "normgroups": lambda: values[GROUPS]}[structure]()
        torch.testing.assert_close(prior.per_tensor(values), per_tensor, rtol=0, atol=0)
        per_param = torch.repeat_interleave(per_tensor, sizes)
    torch.testing.assert_close(prior.per_parameter(values), per_param, rtol=0, atol=0)
    params = _params()
    theta = torch.cat(params)
    torch.testing.assert_close(prior.penalty(values, params), 0.5 * (per_param * theta**2).sum(), rtol=1e-15, atol=0)
    form = prior.structure_form(values)
    assert form.numel() == (5 if structure == "normgroups" else n)
    torch.testing.assert_close(prior.vector(0.5, dtype=torch.float64), torch.full((n,), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match=f"prior_structure='{structure}' needs {n}"):
        prior.vector(torch.ones(n + 1))


def test_from_per_tensor_group_means():
    per_tensor = torch.tensor([1.0, 3.0, 5.0, 2.0, 4.0], dtype=torch.float64)
    got = Prior("normgroups", SIZES, GROUPS).from_per_tensor(per_tensor)
    torch.testing.assert_close(got, torch.tensor([5.0, 2.0, per_tensor.mean(), 3.0], dtype=torch.float64))
    torch.testing.assert_close(Prior("scalar", SIZES).from_per_tensor(per_tensor), per_tensor.mean().reshape(1))
    torch.testing.assert_close(Prior("diagonal", SIZES).from_per_tensor(per_tensor),
                               torch.repeat_interleave(per_tensor, torch.tensor(SIZES)))
    with pytest.raises(ValueError, match="normgroups' needs the group index"):
        Prior("normgroups", SIZES)
    with pytest.raises(ValueError, match="prior_structure must be one of"):
        Prior("blockwise", SIZES)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)).double()


@pytest.mark.parametrize("per_param", [False, True])
def test_map_module_penalty(per_param):
    model = _net()
    params = list(model.parameters())
    n = sum(p.numel() for p in params) if per_param else len(params)
    delta = torch.linspace(0.5, 3.0, n)
    module = MAPModule(model, "regression", n_data=10,
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.1)),
                       prior_precision=delta)
    theta = torch.cat([p.detach().flatten() for p in params])
    per = delta.double() if per_param else torch.repeat_interleave(delta.double(), torch.tensor([p.numel() for p in params]))
    torch.testing.assert_close(module.prior_term().detach(), 0.5 * (per * theta**2).sum(), rtol=1e-6, atol=0)


def test_laplace_and_module_share_the_normgroups_expansion():
    model = _net()
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron", prior_structure="normgroups",
                 example_input=torch.zeros(2, 3, dtype=torch.float64))
    groups = la.prior_groups
    assert groups.tolist() == [1, 1, 0, 0, 0, 0]  # Linear -> BatchNorm is a normalised group
    values = torch.tensor([0.5, 2.0], dtype=torch.float64)
    la.prior_precision = values
    torch.testing.assert_close(la.structure_prior, values[groups])
    torch.testing.assert_close(la.prior_precision_diag, torch.repeat_interleave(values[groups], torch.tensor(la.sizes)))
    buffer = torch.arange(1.0, 7.0)
    log_p = initial_log_prior(buffer, model, la.params, "normgroups", groups=groups)
    torch.testing.assert_close(log_p.exp(), torch.tensor([(3.0 + 4 + 5 + 6) / 4, 1.5]))
    new = write_prior(buffer, model, la.params, "normgroups", values.float(), groups=groups)
    torch.testing.assert_close(new, values.float()[groups])
