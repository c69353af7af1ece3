"""Engine vs dense float64 torch.func references on a small MLP and a small CNN."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from laplace_refs import (
    cnn,
    data,
    dense_curvature,
    dense_jacobian,
    dense_loglik,
    dense_marglik,
    loader,
    mlp,
    output_hessian,
)
from torch import nn

from laplace_lab.laplace import Laplace

LIKS = ["classification", "regression", "heteroscedastic_regression"]
D_OUT = {"classification": 3, "regression": 2, "heteroscedastic_regression": 4}


def make(kind, lik, seed=0):
    d = D_OUT[lik]
    return mlp(d_out=d, seed=seed) if kind == "mlp" else cnn(d_out=d, seed=seed)


def fitted(model, lik, X, y, batch_size=5, **kw):
    la = Laplace(model, lik, **kw)
    la.fit(loader(X, y, batch_size))
    return la


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("curv", ["ggn", "ef"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_full_and_diag_match_dense(kind, lik, curv, subset):
    model = make(kind, lik)
    X, y = data(kind, lik, d_out=D_OUT[lik])
    ref = None
    for structure in ["full", "diag"]:
        la = fitted(model, lik, X, y, subset_of_weights=subset, hessian_structure=structure, curvature=curv)
        if ref is None:
            ref = dense_curvature(model, la, X, y, curv, lik)
        expect = ref if structure == "full" else ref.diagonal()
        torch.testing.assert_close(la.H, expect, rtol=1e-9, atol=1e-11)


def test_ggn_output_hessians_are_psd_and_heteroscedastic_ggn_psd():
    torch.manual_seed(0)
    f = torch.randn(50, 4, dtype=torch.float64) * 3
    for lik in LIKS:
        H = output_hessian(lik, f if lik != "classification" else f[:, :3])
        assert torch.linalg.eigvalsh(H).min() > -1e-10
    model = make("mlp", "heteroscedastic_regression")
    X, y = data("mlp", "heteroscedastic_regression", d_out=4)
    la = fitted(model, "heteroscedastic_regression", X, y, subset_of_weights="all", hessian_structure="full")
    ev = torch.linalg.eigvalsh(la.H)
    assert ev.min() > -1e-10 * ev.max()


def _block_slices(la):
    i, out = 0, []
    for p in la.params:
        out.append(slice(i, i + p.numel()))
        i += p.numel()
    return out


def _kron_dense(la):
    s = la.structure
    return s.dense_precision(torch.ones((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("curv", ["ggn", "ef"])
def test_kron_exact_on_single_datum(lik, curv):
    model = make("mlp", lik)
    X, y = data("mlp", lik, n=1, d_out=D_OUT[lik])
    la = fitted(model, lik, X, y, subset_of_weights="all", hessian_structure="kron", curvature=curv)
    ref = dense_curvature(model, la, X, y, curv, lik)
    K = _kron_dense(la)
    for sl in _block_slices(la):  # weight and bias blocks exact; cross blocks dropped by design
        torch.testing.assert_close(K[sl, sl], ref[sl, sl], rtol=1e-9, atol=1e-11)
    mask = torch.block_diag(*[torch.ones(sl.stop - sl.start, sl.stop - sl.start) for sl in _block_slices(la)])
    assert (K[mask == 0] == 0).all()


def test_kron_exact_for_single_linear_layer_regression():
    torch.manual_seed(0)
    model = nn.Linear(4, 3).double()
    X = torch.randn(30, 4, dtype=torch.float64)
    y = torch.randn(30, 3, dtype=torch.float64)
    la = fitted(model, "regression", X, y, batch_size=7, subset_of_weights="all", hessian_structure="kron")
    ref = dense_curvature(model, la, X, y, "ggn", "regression")
    K = _kron_dense(la)
    for sl in _block_slices(la):
        torch.testing.assert_close(K[sl, sl], ref[sl, sl], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("curv", ["ggn", "ef"])
def test_kron_conv_matches_curvlinops_kfac_expand(curv):
    curvlinops = pytest.importorskip("curvlinops")
    model = make("cnn", "classification")
    X, y = data("cnn", "classification", n=10)
    la = fitted(model, "classification", X, y, batch_size=4, subset_of_weights="all",
                hessian_structure="kron", curvature=curv)
    ft = {"ggn": curvlinops.FisherType.TYPE2, "ef": curvlinops.FisherType.EMPIRICAL}[curv]
    op = curvlinops.KFACLinearOperator(model, nn.CrossEntropyLoss(reduction="sum"), list(model.parameters()),
                                       [(X, y)], fisher_type=ft, separate_weight_and_bias=True,
                                       check_deterministic=False)
    ref = op @ torch.eye(la.n_params, dtype=torch.float64)
    torch.testing.assert_close(_kron_dense(la), torch.as_tensor(ref), rtol=1e-8, atol=1e-10)


def test_kron_other_modules_get_exact_diagonal_blocks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.LayerNorm(5), nn.Linear(5, 3)).double()
    model.train()
    X, y = data("mlp", "classification", n=16)
    model(X)  # populate BatchNorm running statistics
    la = fitted(model, "classification", X, y, batch_size=6, subset_of_weights="all", hessian_structure="kron")
    assert model.training  # restored after fit
    model.eval()
    ref = dense_curvature(model, la, X, y, "ggn", "classification")
    K = _kron_dense(la)
    names = [n for n, _ in model.named_parameters()]
    for n, sl in zip(names, _block_slices(la)):
        if n.startswith(("1.", "3.")):  # BatchNorm / LayerNorm: diagonal blocks
            torch.testing.assert_close(K[sl, sl], torch.diag(ref[sl, sl].diagonal()), rtol=1e-9, atol=1e-11)
    assert la.n_params == sum(p.numel() for p in model.parameters())


def test_mc_fisher_reproduces_ef_of_sampled_labels():
    lik = "classification"
    model = make("mlp", lik)
    X, y = data("mlp", lik)
    n_mc, seed = 3, 123
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure="full", curvature="mc_fisher",
                 n_mc_samples=n_mc, seed=seed)
    la.fit(loader(X, y))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        p = model(X).softmax(-1)
    ref = 0
    for _ in range(n_mc):
        ys = torch.multinomial(p, 1, generator=gen).squeeze(-1)
        ref = ref + dense_curvature(model, la, X, ys, "ef", lik) / n_mc
    torch.testing.assert_close(la.H, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_mc_fisher_converges_to_ggn(structure):
    """Tolerance from the exact variance of the one-sample estimator (enumerating labels)."""
    lik = "classification"
    model = make("mlp", lik)
    X, y = data("mlp", lik, n=6)
    n_mc = 400
    la = fitted(model, lik, X, y, subset_of_weights="all", hessian_structure="full", curvature="mc_fisher",
                n_mc_samples=n_mc, seed=0)
    ggn = dense_curvature(model, la, X, y, "ggn", lik)
    # Var of sum_n X_n, X_n = J^T (p - e_y)(p - e_y)^T J, y ~ Cat(p_n): enumerate the labels
    J = dense_jacobian(model, la, X)
    with torch.no_grad():
        p = model(X).softmax(-1)
    var = 0.0
    for n in range(X.shape[0]):
        terms = [J[n].T @ torch.outer(p[n] - e, p[n] - e) @ J[n] for e in torch.eye(3, dtype=torch.float64)]
        mean = sum(pc * t for pc, t in zip(p[n], terms))
        var += sum(pc * (t - mean).square().sum() for pc, t in zip(p[n], terms))
    err = (la.H - ggn).norm()
    assert err < 5 * math.sqrt(var / n_mc)
    assert err > 0  # it is a sampled estimate, not the GGN itself


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("prior_structure", ["scalar", "layerwise", "diagonal"])
@pytest.mark.parametrize("lik", ["classification", "regression"])
def test_logdet_and_marglik_against_dense(structure, prior_structure, lik):
    if structure == "kron" and prior_structure == "diagonal":
        pytest.skip("rejected combination (tested in test_errors)")
    kind = "cnn" if structure == "kron" else "mlp"
    model = make(kind, lik)
    X, y = data(kind, lik, d_out=D_OUT[lik])
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure=structure, prior_structure=prior_structure,
                 sigma_noise=0.7 if lik == "regression" else 1.0, temperature=0.8)
    g = torch.Generator().manual_seed(3)
    n = {"scalar": 1, "layerwise": la.n_layers, "diagonal": la.n_params}[prior_structure]
    la.prior_precision = torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.1
    la.fit(loader(X, y, 5))
    sigma = 0.7 if lik == "regression" else 1.0
    c = 1 / (sigma**2 * 0.8) if lik == "regression" else 1 / 0.8
    if structure == "kron":
        H = _kron_dense(la)
    else:
        H = dense_curvature(model, la, X, y, "ggn", lik)
        H = H if structure == "full" else torch.diag(H.diagonal())
    prior_diag = la.prior_precision_diag
    P = c * H + torch.diag(prior_diag)
    torch.testing.assert_close(la.log_det_posterior_precision, torch.linalg.slogdet(P)[1], rtol=1e-10, atol=1e-10)
    # tempering divides the data-fit term by T but not the Gaussian normaliser (laplace-torch)
    norm = X.shape[0] * D_OUT[lik] * math.log(sigma * math.sqrt(2 * math.pi)) if lik == "regression" else 0.0
    loglik = (dense_loglik(model, X, y, lik, sigma) + norm) / 0.8 - norm
    ref = dense_marglik(loglik, H, c, prior_diag, la.mean)
    torch.testing.assert_close(la.log_marginal_likelihood(), ref, rtol=1e-10, atol=1e-9)
    # its three terms, each against the dense one
    terms = la.log_marginal_likelihood_terms()
    torch.testing.assert_close(terms["log_lik"], torch.as_tensor(loglik, dtype=torch.float64), rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(terms["log_det_ratio"], torch.linalg.slogdet(P)[1] - prior_diag.log().sum(),
                               rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(terms["scatter"], la.mean @ (prior_diag * la.mean), rtol=1e-10, atol=1e-9)
    # the log det ratio split by parameter tensor: the dense diagonal blocks' (kron, diag); full couples them
    if structure == "full":
        with pytest.raises(ValueError, match=r"hessian_structure='full' couples.*split: \[.*'diag'.*'kron'"):
            la.log_det_ratio_by_tensor()
    else:
        by_tensor, i = la.log_det_ratio_by_tensor(), 0
        assert list(by_tensor) == [n for n, _ in model.named_parameters()]
        for name, p in model.named_parameters():
            block = slice(i, i + p.numel())
            ref_block = torch.linalg.slogdet(P[block, block])[1] - prior_diag[block].log().sum()
            torch.testing.assert_close(by_tensor[name], ref_block, rtol=1e-10, atol=1e-9)
            i += p.numel()
        torch.testing.assert_close(sum(by_tensor.values()), terms["log_det_ratio"], rtol=1e-12, atol=1e-9)
    # posterior queries against the dense covariance
    Sigma = torch.linalg.inv(P)
    torch.testing.assert_close(la.posterior_variance, Sigma.diagonal(), rtol=1e-8, atol=1e-12)
    J = dense_jacobian(model, la, X[:4])
    torch.testing.assert_close(la.functional_variance(J), J @ Sigma @ J.transpose(1, 2), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_marglik_gradients_match_finite_differences(structure):
    lik = "regression"
    model = make("mlp", lik)
    X, y = data("mlp", lik, d_out=2)
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure=structure, prior_structure="layerwise")
    la.fit(loader(X, y, 5))
    log_pp = torch.linspace(-1, 1, la.n_layers, dtype=torch.float64).requires_grad_(True)
    log_sigma = torch.tensor(-0.3, dtype=torch.float64, requires_grad=True)

    def f(lp, ls):
        return la.log_marginal_likelihood(lp.exp(), ls.exp())

    g_pp, g_s = torch.autograd.grad(f(log_pp, log_sigma), [log_pp, log_sigma])
    eps = 1e-6
    with torch.no_grad():
        fd_pp = torch.stack([(f(log_pp + eps * e, log_sigma) - f(log_pp - eps * e, log_sigma)) / (2 * eps)
                             for e in torch.eye(la.n_layers, dtype=torch.float64)])
        fd_s = (f(log_pp, log_sigma + eps) - f(log_pp, log_sigma - eps)) / (2 * eps)
    torch.testing.assert_close(g_pp, fd_pp, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_s, fd_s, rtol=1e-6, atol=1e-7)
    assert g_pp.abs().min() > 0  # non-trivial gradients


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_full_float32_model_small_noise_logdet_is_exact(kind):
    """A float32 model with tiny noise: c = 1/sigma^2 = 1e8 times float32 rounding of a rank-deficient
    ``V^T V`` (P > N) would exceed the prior precision 1 and break Cholesky; the full structure
    accumulates in float64, so the log det matches the dense float64 reference."""
    torch.manual_seed(0)
    model = nn.Linear(50, 1) if kind == "linear" else nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    X = torch.randn(20, model[0].in_features if kind == "mlp" else 50)
    y = torch.randn(20, 1)
    sigma = 1e-4
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="full", sigma_noise=sigma,
                 prior_precision=1.0)
    la.fit(loader(X, y))
    assert la.n_params > len(X)  # rank-deficient curvature: the prior alone keeps it definite
    ref_model = copy.deepcopy(model).double()
    la64 = Laplace(ref_model, "regression", subset_of_weights="all", hessian_structure="full")
    H = dense_curvature(ref_model, la64, X.double(), y.double(), "ggn", "regression")
    ref = torch.linalg.slogdet(H / sigma**2 + torch.eye(la.n_params, dtype=torch.float64))[1]
    assert la.H.dtype == torch.float32
    assert float(la.log_det_posterior_precision) == pytest.approx(float(ref), rel=1e-5)
