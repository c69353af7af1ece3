"""``map_loss_scale``: the MAP training loss as the per-datum negative log joint (``nll``) or, for
regression, scaled by ``2 sigma^2 T`` (``mse``), laplace-torch ``marglik_training``'s objective.

Checked against the peer's formula (``MSE + 0.5 delta ||theta||^2 / N / (T / (2 sigma^2))``) on a
fixed tiny network, and against laplace-torch's ``marglik_training`` itself: with the same initial
weights, ``mse`` follows its weight trajectory through the sigma updates, ``nll`` does not.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from laplace_lab.training.module import MAPCore, MAPOptimisation
from laplace_lab.training.online_marglik import OnlineMarglikCore, OnlineMarglikOptions
from laplace_lab.training.plain_loop import PlainTrainer
from tests.conftest import compose_config
from tests.training.marglik_helpers import TensorDataModule

pytestmark = pytest.mark.usefixtures("one_thread")


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()


def _data(n: int = 24):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(X.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return X, y


def _module(model, scale: str, n: int, sigma: float = 0.3, temperature: float = 1.0, prior=(0.5, 2.0, 3.0, 0.7)):
    return MAPCore(model, "regression", n_data=n,
                   optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.0), loss_scale=scale),
                   prior_precision=torch.tensor(prior), sigma_noise=sigma, temperature=temperature)


def _peer_objective(model, X, y, delta_per_tensor, sigma: float, temperature: float) -> torch.Tensor:
    """laplace-torch marglik_training's regression loss, written out:
    ``MSE_mean(f, y) + 0.5 (delta theta) . theta / N / crit``, ``crit = T / (2 sigma^2)``."""
    theta = parameters_to_vector(model.parameters())
    delta = torch.cat([d * torch.ones(p.numel(), dtype=theta.dtype) for d, p in zip(delta_per_tensor, model.parameters())])
    crit = temperature / (2 * sigma**2)
    return nn.functional.mse_loss(model(X), y) + 0.5 * (delta * theta) @ theta / len(X) / crit


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_mse_scale_is_the_peer_objective(temperature):
    """Same gradient as the peer's loss; the values differ by the constant ``2 sigma^2 (log sigma +
    log(2 pi) / 2)`` of the Gaussian NLL. marglik_training's temperature multiplies the likelihood
    (``crit = T / (2 sigma^2)``), ours divides it (``NLL / T``): our T is the peer's 1 / T."""
    X, y = _data()
    sigma, prior = 0.3, (0.5, 2.0, 3.0, 0.7)
    model = _net()
    module = _module(model, "mse", len(X), sigma, temperature, prior)
    sigma, prior = float(module.sigma_noise), module.prior_precision.tolist()  # the float32 buffers' values
    ours = module.training_step((X, y), 0)
    ours_grad = torch.autograd.grad(ours, list(model.parameters()))
    peer = _peer_objective(model, X, y, prior, sigma, 1 / temperature)
    peer_grad = torch.autograd.grad(peer, list(model.parameters()))
    for a, b in zip(ours_grad, peer_grad):  # sigma and the scale are float32 buffers: float32 rounding
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-10)
    const = 2 * sigma**2 * (math.log(sigma) + 0.5 * math.log(2 * math.pi))
    assert float((ours - peer).detach()) == pytest.approx(const, rel=1e-6)


def test_nll_scale_is_the_per_datum_log_joint():
    """Default: ``mean Gaussian NLL / T + prior / N``, i.e. the peer's gradient (peer temperature
    ``1 / T``) divided by ``2 sigma^2 T``."""
    X, y = _data()
    sigma, prior, temperature = 0.3, (0.5, 2.0, 3.0, 0.7), 2.0
    model = _net()
    module = _module(model, "nll", len(X), sigma, temperature, prior)
    sigma, prior = float(module.sigma_noise), module.prior_precision.tolist()  # the float32 buffers' values
    ours = module.training_step((X, y), 0)
    nll = -torch.distributions.Normal(model(X), sigma).log_prob(y).mean()
    theta_sq = [p.square().sum() for p in model.parameters()]
    expected = nll / temperature + 0.5 * sum(d * t for d, t in zip(prior, theta_sq)) / len(X)
    assert float(ours.detach()) == pytest.approx(float(expected), rel=1e-12)
    ours_grad = torch.autograd.grad(ours, list(model.parameters()))
    peer_grad = torch.autograd.grad(_peer_objective(model, X, y, prior, sigma, 1 / temperature),
                                    list(model.parameters()))
    for a, b in zip(ours_grad, peer_grad):
        torch.testing.assert_close(a * (2 * sigma**2 * temperature), b, rtol=1e-6, atol=1e-10)


def _train_ours(scale: str, X, y, epochs: int, k: int):
    dm = TensorDataModule(X, y, batch_size=len(X))
    module = MAPCore(_net(), "regression", n_data=len(X),
                     optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.Adam(p, lr=1e-2), loss_scale=scale))
    callback = OnlineMarglikCore(OnlineMarglikOptions({"subset_of_weights": "all", "hessian_structure": "full", "curvature": "ggn"},
                                                      prior_structure="layerwise", frequency=1, n_steps=k, burnin=1, lr_hyp=0.1,
                                                      early_stopping=False))
    PlainTrainer(epochs, torch.device("cpu"), callbacks=[callback], check_val_every_n_epoch=epochs + 1).fit(module, dm)
    return [p.detach() for p in module.model.parameters()], float(module.sigma_noise)


def test_mse_scale_follows_laplace_torch_marglik_training():
    """Same initial weights, data, Adam and marglik schedule (every epoch, K hyper steps): after the
    sigma updates ``mse`` ends at laplace-torch's weights, ``nll`` elsewhere (float64)."""
    laplace_torch = pytest.importorskip("laplace")
    from laplace.curvature import BackPackGGN

    X, y = _data(40)
    epochs, k = 8, 10
    model = _net()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=len(X))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        la, model, margliks, _ = laplace_torch.marglik_training(
            model, loader, likelihood="regression", hessian_structure="full", backend=BackPackGGN,
            optimizer_kwargs={"lr": 1e-2}, n_epochs=epochs, lr_hyp=0.1, prior_structure="layerwise",
            n_epochs_burnin=1, n_hypersteps=k, marglik_frequency=1)
    # the peer returns its best-marglik epoch: the comparison needs that to be the last one
    per_epoch = margliks[k - 1::k]
    assert per_epoch.index(min(per_epoch)) == epochs - 1
    peer = [p.detach() for p in model.parameters()]
    mse, sigma = _train_ours("mse", X, y, epochs, k)
    assert sigma < 0.8  # sigma did move from 1, so the two scales differ
    for a, b in zip(mse, peer):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    nll, _ = _train_ours("nll", X, y, epochs, k)
    assert max(float((a - b).abs().max()) for a, b in zip(nll, peer)) > 1e-4


@pytest.mark.parametrize("scale", ["nll", "mse"])
def test_fused_regression_ef_equals_the_exact_pass(scale):
    """Fused EF (per-sample gradients read off the training backward, divided by ``nll_scale``)
    equals the extra data pass when the weights do not move (lr 0), with sigma != 1: the engine's
    EF takes unit-noise NLL gradients, so ``nll_scale`` must hold the ``1 / sigma^2`` of the loss
    (and ``mse``'s ``2 sigma^2 T``); otherwise the EF is off by ``sigma^4`` or the scale squared."""
    import pytorch_lightning as pl

    from laplace_lab.training import MAPModule
    from laplace_lab.training.online_marglik import OnlineMarglik

    X, y = _data(32)
    histories = []
    for fused in (False, True):
        module = MAPModule(_net(), "regression", n_data=len(X),
                           optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.0), loss_scale=scale),
                           sigma_noise=0.5)
        callback = OnlineMarglik(OnlineMarglikOptions({"subset_of_weights": "all", "hessian_structure": "kron", "curvature": "ef"},
                                                      prior_structure="layerwise", n_steps=5, early_stopping=False, fused=fused))
        trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                             callbacks=[callback], accelerator="cpu")
        trainer.fit(module, datamodule=TensorDataModule(X, y, batch_size=8))
        histories.append([h["marglik/log_marglik"] for h in callback.history])
    assert len(histories[0]) == 3 and histories[0] == pytest.approx(histories[1], rel=1e-10)


def test_bad_values_are_rejected():
    with pytest.raises(ValueError, match=r"map_loss_scale='sum' is not supported; allowed: \['nll', 'mse'\]"):
        _module(_net(), "sum", 10)
    with pytest.raises(ValueError, match=r"map_loss_scale='mse' needs likelihood 'regression'.*allowed.*\['nll'\]"):
        MAPCore(_net(), "classification", n_data=10,
                optimisation=MAPOptimisation(optimizer=torch.optim.Adam, loss_scale="mse"))


@pytest.mark.parametrize("overrides,pattern", [
    (["map_loss_scale=sum"], r"map_loss_scale='sum' is not supported; allowed: \['nll', 'mse'\]"),
    (["map_loss_scale=mse", "likelihood=classification"], r"map_loss_scale='mse' needs likelihood 'regression'"),
])
def test_config_rejects_bad_values_before_any_work(overrides, pattern):
    from laplace_lab.config.load import load_run_config

    with pytest.raises(ValueError, match=pattern):
        load_run_config(compose_config(overrides))


def test_immer2021_uci_uses_the_peer_scale():
    assert compose_config(["experiment=immer2021_uci"]).map_loss_scale == "mse"
    assert compose_config([]).map_loss_scale == "nll"
