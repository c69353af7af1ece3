"""The MAP objective: mean NLL / T + 0.5 sum_g delta_g ||theta_g||^2 / N."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from laplace_lab.training import MAPModule
from laplace_lab.training.module import MAPOptimisation
from laplace_lab.training.nll import summed_nll


def make_module(likelihood="regression", prior=None, n_out=2, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, n_out))
    return MAPModule(model, likelihood, n_data=50,
                     optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.1)),
                     prior_precision=prior if prior is not None else 1.0, **kw)


def test_loss_matches_hand_computation():
    delta = torch.tensor([0.5, 1.0, 2.0, 3.0])
    module = make_module(prior=delta, sigma_noise=0.7, temperature=2.0)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    loss = module.training_step((x, y), 0)
    f = module.model(x)
    nll = (0.5 * ((f - y) ** 2).sum() / 0.49 + 0.5 * 16 * math.log(2 * math.pi * 0.49)) / 8
    prior = 0.5 * sum(d * p.pow(2).sum() for d, p in zip(delta, module.model.parameters()))
    assert torch.allclose(loss, nll / 2.0 + prior / 50, rtol=1e-5)


def test_loss_without_prior_is_the_nll_alone():
    delta = torch.tensor([0.5, 1.0, 2.0, 3.0])
    with_prior = make_module(prior=delta, temperature=2.0)
    without = make_module(prior=delta, temperature=2.0, prior_in_loss=False)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    nll = summed_nll(without.model(x), y, "regression") / 8
    assert torch.allclose(without.training_step((x, y), 0), nll / 2.0, rtol=1e-6)
    assert torch.allclose(with_prior.training_step((x, y), 0) - without.training_step((x, y), 0),
                          with_prior.prior_term() / 50, rtol=1e-5)


def test_diagonal_prior_and_bad_shape():
    module = make_module()
    n_params = sum(p.numel() for p in module.model.parameters())
    module.set_prior_precision(torch.full((n_params,), 2.0))
    theta = torch.cat([p.flatten() for p in module.model.parameters()])
    assert torch.allclose(module.prior_term(), theta.pow(2).sum())
    with pytest.raises(ValueError, match="allowed: 1, 4"):
        module.set_prior_precision(torch.ones(7))


def test_heteroscedastic_nll_is_gaussian():
    mu, var = torch.tensor([[0.3]]), torch.tensor([[0.5]])
    eta2 = -1 / (2 * var)
    eta1 = -2 * eta2 * mu
    raw = torch.log(torch.expm1(-eta2))  # inverse softplus
    y = torch.tensor([[1.1]])
    expected = -torch.distributions.Normal(mu, var.sqrt()).log_prob(y).sum()
    got = summed_nll(torch.cat([eta1, raw], -1), y, "heteroscedastic_regression")
    assert torch.allclose(got, expected, atol=1e-5)


def test_hyperparameters_are_buffers_not_parameters():
    module = make_module()
    names = {n for n, _ in module.named_parameters()}
    assert not any("prior" in n or "sigma" in n for n in names)
    assert "prior_precision" in dict(module.named_buffers()) and "log_sigma_noise" in dict(module.named_buffers())


def test_hyperparameter_buffers_follow_the_model_dtype(tmp_path):
    """A float64 model's prior precision and noise live in float64 (no float32 rounding of the
    values set: 0.8 is not a float32 number), also after ``.double()`` / ``.to(dtype)``, after the
    setters, and through a state-dict round trip (what a checkpoint restore does)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    module = MAPModule(model, "regression", n_data=50,
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.1)),
                       prior_precision=0.1, sigma_noise=0.8)
    assert module.prior_precision.dtype == module.log_sigma_noise.dtype == torch.float64
    assert module.sigma_noise.item() == pytest.approx(0.8, rel=1e-15)  # float32 would be off by 1.5e-8
    assert module.prior_precision[0].item() == 0.1

    single = make_module(sigma_noise=0.8)  # a float32 model keeps float32 buffers
    assert single.prior_precision.dtype == single.log_sigma_noise.dtype == torch.float32
    for cast in (lambda m: m.double(), lambda m: m.to(torch.float64)):
        moved = cast(make_module(sigma_noise=0.8))
        moved.set_sigma_noise(0.3)
        moved.set_prior_precision(torch.tensor(0.7, dtype=torch.float32))
        assert moved.prior_precision.dtype == moved.log_sigma_noise.dtype == torch.float64
        assert moved.sigma_noise.item() == pytest.approx(0.3, rel=1e-15)

    module.set_sigma_noise(torch.tensor(0.1 + 1e-12, dtype=torch.float64))
    module.set_prior_precision(torch.tensor([0.25 + 1e-12, 1.0, 2.0, 3.0], dtype=torch.float64))
    torch.save(module.state_dict(), tmp_path / "state.pt")
    restored = MAPModule(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double(), "regression",
                         n_data=50, optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.1)))
    restored.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert restored.log_sigma_noise.dtype == restored.prior_precision.dtype == torch.float64
    assert torch.equal(restored.log_sigma_noise, module.log_sigma_noise)
    assert torch.equal(restored.prior_precision, module.prior_precision)
