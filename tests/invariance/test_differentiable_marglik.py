"""Differentiable-in-eta Laplace marglik: finite differences, the engine's Laplace, dense float64."""

import math

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

    dmod = VisionDataModule(name="mnist", data_dir=str(data_dir), n_val=128, n_train_subset=128, seed=0, batch_size=250,
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


def _linear():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, C))


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kron_normalisation_against_the_dense_curvature_of_the_averaged_model(curvature):
    """One datum, one linear layer: ``f = W mean_s(T_s x) + b`` is linear in the averaged input, so the
    reduce KFAC (inputs averaged, output gradients summed over the S samples) is the exact GGN / EF
    block of each parameter tensor at any eta. A factor S or 1/S in either Kronecker factor fails here."""
    torch.manual_seed(1)
    model = AugmentedModel(_linear(), AffineAugmentation(S, ETA0, TRANSFORMS, "bilinear")).double()
    X, y = torch.rand(1, 1, 8, 8, dtype=torch.float64), torch.tensor([2])
    eps = model.augmentation.sample_eps(1)
    params = dict(model.net.named_parameters())

    def f(p):
        return functional_call(model.net, p, (model.augmentation(X, eps),)).reshape(1, S, C).mean(1)

    out, J = f(params), jacrev(f)(params)
    prob = out.softmax(-1)[0]
    if curvature == "ggn":
        M = torch.diag(prob) - torch.outer(prob, prob)
    else:
        r = prob - torch.nn.functional.one_hot(y, C)[0].double()
        M = torch.outer(r, r)
    fac = dm.batch_factors(model, X, y, "kron", curvature, eps=eps, create_graph=False)
    part = fac.layers[0]
    Jw, Jb = J["1.weight"].reshape(C, -1), J["1.bias"].reshape(C, C)
    dense_w, dense_b = Jw.T @ M @ Jw, Jb.T @ M @ Jb
    # weight: index (o, i) row-major = G (x) A; bias: G
    torch.testing.assert_close(torch.kron(part["G"], part["A"] / part["rows"]), dense_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(part["G"], dense_b, rtol=1e-10, atol=1e-12)
    prior = torch.tensor([0.5], dtype=torch.float64)
    P = dense_w.shape[0] + C
    logdet = torch.logdet(dense_w + 0.5 * torch.eye(dense_w.shape[0], dtype=torch.float64)) + torch.logdet(
        dense_b + 0.5 * torch.eye(C, dtype=torch.float64))
    theta2 = sum(p.detach().square().sum() for p in params.values())
    nll = torch.nn.functional.cross_entropy(out, y, reduction="sum")
    dense = -nll - 0.5 * (logdet - P * math.log(0.5) + 0.5 * theta2)
    ours = dm.log_marglik(model, X, y, model.augmentation.eta, prior, "kron", curvature, eps=eps)
    torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-8)


@pytest.mark.parametrize("make", [_cnn, _mlp])
@pytest.mark.parametrize("structure", ["kron", "diag"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_fit_laplace_gives_the_engine_the_averaged_model_curvature(make, structure, curvature):
    """The prior step's Laplace (``fit_laplace``) has the eta step's marglik at any prior, and at eta = 0
    the engine's marglik of the plain network; the engine's own fit of the augmented rows differs."""
    model, X, y, eps = _setup(make, mode="bilinear")
    model.frozen_eps = eps
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                 curvature=curvature, prior_precision=1.0, prior_structure="layerwise")
    fac = dm.fit_laplace(la, model, [(X, y)])
    assert fac.n == N and la.n_data == N and la.fitted
    n_tensors = len(list(model.net.parameters()))
    for prior in (torch.full((n_tensors,), 0.7, dtype=torch.float64),
                  torch.linspace(0.3, 2.0, n_tensors, dtype=torch.float64)):
        ref = dm.log_marglik(model, X, y, model.augmentation.eta, prior, structure, curvature, eps=eps)
        torch.testing.assert_close(la.log_marginal_likelihood(prior_precision=prior), ref, rtol=1e-10, atol=1e-8)
    engine = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                     curvature=curvature, prior_precision=0.7)
    engine.fit([(X, y)])
    if structure == "kron":
        assert not torch.allclose(engine.log_marginal_likelihood(), la.log_marginal_likelihood(
            torch.full((n_tensors,), 0.7, dtype=torch.float64)))

    zero, X0, y0, eps0 = _setup(make, mode="bilinear", eta={})
    zero.frozen_eps = eps0
    la0 = Laplace(zero, "classification", subset_of_weights="all", hessian_structure=structure, curvature=curvature)
    dm.fit_laplace(la0, zero, [(X0, y0)])
    plain = Laplace(zero.net, "classification", subset_of_weights="all", hessian_structure=structure,
                    curvature=curvature)
    plain.fit([(X0, y0)])
    torch.testing.assert_close(la0.log_marginal_likelihood(0.7), plain.log_marginal_likelihood(0.7),
                               rtol=1e-10, atol=1e-8)


def test_fit_laplace_rejects_other_fits():
    model, X, y, eps = _setup()
    for kwargs in ({"hessian_structure": "full"}, {"hessian_structure": "kron", "subset_of_weights": "last_layer"}):
        la = Laplace(model, "classification", **{"subset_of_weights": "all", **kwargs})
        with pytest.raises(ValueError, match="hessian_structure in"):
            dm.fit_laplace(la, model, [(X, y)])
    other = AugmentedModel(_cnn().double(), model.augmentation)
    la = Laplace(other, "classification", subset_of_weights="all", hessian_structure="kron")
    with pytest.raises(ValueError, match="same AugmentedModel"):
        dm.fit_laplace(la, model, [(X, y)])


def test_kron_fit_retries_in_float64_when_float32_eigh_returns_nan(monkeypatch):
    """float32 LAPACK ``eigh`` can return NaN eigenvalues without raising (A of a plain MLP 784-200-10
    on 200 MNIST images): the KFAC fit then redoes the decomposition in float64."""
    torch.manual_seed(0)
    net = _mlp()
    X, y = torch.rand(N, 1, 8, 8), torch.randint(0, C, (N,))
    ref = Laplace(net, "classification", subset_of_weights="all", hessian_structure="kron", prior_precision=0.5)
    ref.fit([(X, y)])
    eigh = torch.linalg.eigh

    def nan_in_float32(M):
        lam, Q = eigh(M)
        return (torch.full_like(lam, float("nan")), Q) if M.dtype == torch.float32 else (lam, Q)

    monkeypatch.setattr(torch.linalg, "eigh", nan_in_float32)
    la = Laplace(net, "classification", subset_of_weights="all", hessian_structure="kron", prior_precision=0.5)
    la.fit([(X, y)])
    assert torch.isfinite(la.log_marginal_likelihood())
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-5, atol=1e-3)
