"""Differentiable-in-eta Laplace marglik: finite differences, the engine's Laplace, dense float64."""

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from laplace_lab.laplace import Laplace
from laplace_lab.laplace import differentiable_marglik as dm
from laplace_lab.models.augmentation import TRANSFORMS, AffineAugmentation, AugmentedModel

S, N, C = 3, 6, 4
ETA0 = {"rotation": 0.5, "translate_x": 0.1, "translate_y": -0.05, "scale_x": 0.1, "shear": 0.05}


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.MaxPool2d(2), nn.Conv2d(3, 4, 2), nn.Tanh(),
                         nn.Flatten(), nn.Linear(16, 5), nn.Tanh(), nn.Linear(5, C))


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 7), nn.Tanh(), nn.Linear(7, C))


def _setup(make=_cnn, mode="bicubic", eta=ETA0, seed=0):
    torch.manual_seed(seed)
    model = AugmentedModel(make(), AffineAugmentation(S, eta, TRANSFORMS, mode)).double()
    X = torch.rand(N, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, C, (N,))
    eps = model.augmentation.sample_eps(N)
    return model, X, y, eps


@pytest.mark.parametrize("make", [_cnn, _mlp])
@pytest.mark.parametrize("structure", ["kron", "kron_expand", "diag"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_eta_gradient_matches_finite_differences(make, structure, curvature):
    model, X, y, eps = _setup(make)
    prior = torch.tensor([0.7], dtype=torch.float64)
    eta = model.augmentation.eta.clone().requires_grad_(True)

    def value(e):
        return dm.log_marglik(model, X, y, e, prior, structure, curvature, eps=eps)

    (g,) = torch.autograd.grad(value(eta), eta)
    h = 1e-5
    for i in range(len(TRANSFORMS)):
        e = torch.zeros(len(TRANSFORMS), dtype=torch.float64)
        e[i] = h
        fd = (value(eta.detach() + e) - value(eta.detach() - e)) / (2 * h)
        torch.testing.assert_close(g[i], fd, rtol=1e-4, atol=1e-6)
    assert g.abs().max() > 1e-3  # the check is not vacuous


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_prior_gradient_matches_finite_differences(structure):
    model, X, y, eps = _setup()
    n_tensors = len(list(model.net.parameters()))
    prior = torch.linspace(0.3, 2.0, n_tensors, dtype=torch.float64).requires_grad_(True)
    eta = model.augmentation.eta.clone()
    value = lambda p: dm.log_marglik(model, X, y, eta, p, structure, "ggn", eps=eps)  # noqa: E731
    (g,) = torch.autograd.grad(value(prior), prior)
    h = 1e-6
    for i in range(n_tensors):
        e = torch.zeros(n_tensors, dtype=torch.float64)
        e[i] = h
        torch.testing.assert_close(g[i], (value(prior.detach() + e) - value(prior.detach() - e)) / (2 * h),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("make", [_cnn, _mlp])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kron_expand_value_equals_the_engine_on_the_averaged_model(make, curvature):
    model, X, y, eps = _setup(make, mode="bilinear")
    prior = torch.tensor([0.5], dtype=torch.float64)
    ours = dm.log_marglik(model, X, y, model.augmentation.eta, prior, "kron_expand", curvature, eps=eps)
    model.frozen_eps = eps
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                 curvature=curvature, prior_precision=0.5)
    la.fit([(X, y)])
    torch.testing.assert_close(ours, la.log_marginal_likelihood(), rtol=1e-10, atol=1e-8)


def _dense_ggn_diag(model, X, eps):
    params = dict(model.net.named_parameters())

    def f(p):
        xs = model.augmentation(X, eps)
        return functional_call(model.net, p, (xs,)).reshape(N, S, C).mean(1)

    out = f(params)
    J = jacrev(f)(params)
    J = torch.cat([J[k].reshape(N, C, -1) for k in params], -1)  # [N, C, P]
    p = out.softmax(-1)
    M = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndp->p", J, M, J)


def test_diag_is_the_exact_ggn_diagonal_of_the_averaged_model():
    model, X, y, eps = _setup(mode="bilinear")
    fac = dm.batch_factors(model, X, y, "diag", "ggn", eps=eps, create_graph=False)
    torch.testing.assert_close(torch.cat(fac.layers), _dense_ggn_diag(model, X, eps), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make", [_cnn, _mlp])
@pytest.mark.parametrize("structure", ["kron", "diag"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_at_eta_zero_the_value_equals_the_engine_on_the_plain_network(make, structure, curvature):
    """S identical samples: the averaged model is the plain network, and so are kron (reduce) and diag."""
    model, X, y, eps = _setup(make, mode="bilinear", eta={})
    prior = torch.tensor([0.5], dtype=torch.float64)
    ours = dm.log_marglik(model, X, y, model.augmentation.eta, prior, structure, curvature, eps=eps)
    la = Laplace(model.net, "classification", subset_of_weights="all", hessian_structure=structure,
                 curvature=curvature, prior_precision=0.5)
    la.fit([(X, y)])
    torch.testing.assert_close(ours, la.log_marginal_likelihood(), rtol=1e-10, atol=1e-8)
    expand = dm.log_marglik(model, X, y, model.augmentation.eta, prior, "kron_expand", curvature, eps=eps)
    assert not torch.allclose(expand, ours)  # expand under-counts the curvature of identical samples


@pytest.mark.parametrize("structure", ["kron", "kron_expand", "diag"])
def test_partial_fit_keeps_the_full_value_and_scales_the_batch_gradient(structure):
    model, X, y, eps = _setup(mode="bicubic")
    prior = torch.tensor([0.5], dtype=torch.float64)
    model.frozen_eps = eps[:3]
    first = dm.fit_factors(model, [(X[:3], y[:3])], structure)
    model.frozen_eps = eps[3:]
    full = first.combine(dm.fit_factors(model, [(X[3:], y[3:])], structure))
    model.frozen_eps = None
    eta = model.augmentation.eta.clone().requires_grad_(True)
    partial = dm.log_marglik(model, X[3:], y[3:], eta, prior, structure, eps=eps[3:], full=full)
    whole = dm.log_marglik(model, X, y, eta, prior, structure, eps=eps)
    torch.testing.assert_close(partial, whole, rtol=1e-10, atol=1e-8)
    (g_partial,) = torch.autograd.grad(partial, eta)
    (g_whole,) = torch.autograd.grad(whole, eta)
    assert torch.isfinite(g_partial).all() and g_partial.abs().max() > 0
    assert not torch.allclose(g_partial, g_whole)  # one batch's (rescaled) gradient, not the full one


def test_bad_options_are_rejected():
    model, X, y, eps = _setup()
    prior = torch.tensor([1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="structure must be one of"):
        dm.log_marglik(model, X, y, model.augmentation.eta, prior, "full")
    with pytest.raises(ValueError, match="curvature must be one of"):
        dm.log_marglik(model, X, y, model.augmentation.eta, prior, "kron", "mc_fisher")
    with pytest.raises(ValueError, match="AugmentedModel"):
        dm.log_marglik(model.net, X, y, model.augmentation.eta, prior)
    bn = AugmentedModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 4), nn.BatchNorm1d(4)), model.augmentation)
    with pytest.raises(ValueError, match="Linear / nn.Conv2d only"):
        dm.log_marglik(bn.double(), X, y, model.augmentation.eta, prior)
    with pytest.raises(ValueError, match="layerwise"):
        dm.log_marglik(model, X, y, model.augmentation.eta, torch.ones(3, dtype=torch.float64))


def test_kron_fit_survives_float32_eigh_failure(data_dir):
    """A float32 KFAC factor on which LAPACK's eigh does not converge (an augmented MLP, S = 2, on
    128 MNIST images; float32 eigh raised here before the float64 retry in ``KronStructure._eigh``)."""
    from laplace_lab.data import VisionDataModule
    from laplace_lab.models import MLP

    dmod = VisionDataModule("mnist", str(data_dir), n_val=128, n_train_subset=128, seed=0, batch_size=250,
                            eval_batch_size=250)
    dmod.setup()
    torch.manual_seed(0)
    model = AugmentedModel(MLP((1, 28, 28), 10, [1000], "tanh"), AffineAugmentation(2))
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    la.fit(dmod.train_eval_dataloader())
    A = la.H_facs[0][1]  # [G, A] of the first weight, A normalised by its rows
    lam64 = torch.linalg.eigvalsh(A.double()).clamp_min(0)
    torch.testing.assert_close(la.H[0].lamA.double(), lam64, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(la.log_marginal_likelihood())
