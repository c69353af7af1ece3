"""Matrix-free Laplace vs dense float64 references: GGN operator, Lanczos, low-rank
posterior with k = P against hessian_structure="full", CG samples, Hutchinson trace estimates."""

from __future__ import annotations

import math

import pytest
import torch
from laplace_refs import cnn, data, dense_curvature, dense_jacobian, loader, mlp
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.matrix_free import (
    GGNOperator,
    cg,
    functional_variance_jvp,
    functional_variance_lowrank,
    ggn_operator,
    jacobi,
    lanczos,
    linearised_samples,
    log_prior_precision_grad,
    lowrank_preconditioner,
    posterior_samples,
    sampled_predictive,
)
from laplace_lab.laplace.predictive import probit

D_OUT = {"classification": 3, "regression": 2, "heteroscedastic_regression": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


def small_mlp(d_out=3, seed=0):
    """P = 4*12+12 + 12*8+8 + 8*d_out+d_out (191 for d_out = 3)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 12), nn.Tanh(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, d_out)).double()


def small_data(lik, n=40, d_out=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    if lik == "classification":
        y = torch.randint(0, d_out, (n,), generator=g)
    else:
        y = torch.randn(n, d_out if lik == "regression" else d_out // 2, generator=g, dtype=torch.float64)
    return X, y


# ------------------------------------------------------------------------------ GGN operator
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("lik", list(D_OUT))
@pytest.mark.parametrize("curv,subset", [("ggn", "all"), ("ef", "all"), ("ggn", "last_layer")])
def test_ggn_operator_matches_dense(kind, lik, curv, subset):
    d = D_OUT[lik]
    model = mlp(d_out=d) if kind == "mlp" else cnn(d_out=d)
    X, y = data(kind, lik, d_out=d)
    la = Laplace(model, lik, subset_of_weights=subset, hessian_structure="diag", curvature=curv)
    H = dense_curvature(model, la, X, y, curv, lik)
    op = ggn_operator(la, loader(X, y, 5), chunk_size=3)
    V = torch.randn(la.n_params, 3, dtype=torch.float64)
    torch.testing.assert_close(op @ V, H @ V, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(op @ V[:, 0], H @ V[:, 0], rtol=1e-10, atol=1e-10)
    # H = E[J^T M^1/2 eps eps^T M^1/2 J]: the sampling square root has the right shape and scale
    assert op.jt_msqrt(2).shape == (la.n_params, 2)


def test_ggn_operator_matches_curvlinops():
    from curvlinops import GGNLinearOperator

    model = cnn(d_out=3)
    X, y = data("cnn", "classification", d_out=3)
    batches = list(loader(X, y, 5))
    params = [p for p in model.parameters()]
    ref = GGNLinearOperator(model, nn.CrossEntropyLoss(reduction="sum"), params, batches)
    op = GGNOperator(model, "classification", batches)
    V = torch.randn(op.n_params, 2, dtype=torch.float64)
    torch.testing.assert_close(op @ V, ref @ V, rtol=1e-9, atol=1e-10)


def test_operator_options_are_validated():
    model = mlp()
    with pytest.raises(ValueError, match="curvature must be one of"):
        GGNOperator(model, "classification", [], curvature="mc_fisher")
    with pytest.raises(ValueError, match="chunk_size"):
        GGNOperator(model, "classification", [], chunk_size=0)
    with pytest.raises(ValueError, match=r"n_eigs must be >= 1; got 0 \(allowed: integers in \[1, inf\)\)"):
        Laplace(model, "classification", hessian_structure="lowrank", n_eigs=0)
    with pytest.raises(ValueError, match=r"n_eigs=True has the wrong type"):
        Laplace(model, "classification", hessian_structure="lowrank", structure_options={"n_eigs": True})
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['n_eigs'\]; the options of hessian_structure='kron'"):
        Laplace(model, "classification", hessian_structure="kron", n_eigs=5)
    with pytest.raises(ValueError, match="hessian_structure must be one of"):
        Laplace(model, "classification", hessian_structure="lowrnk")
    X, y = data("mlp", "classification")
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank",
                 curvature="mc_fisher")
    with pytest.raises(ValueError, match="curvature must be one of"):
        la.fit(loader(X, y))
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank")
    with pytest.raises(ValueError, match="fit_batch"):
        la.fit_begin()
        la.fit_batch(X, y)


# ------------------------------------------------------------------------------------ Lanczos
def test_lanczos_matches_eigvalsh():
    g = torch.Generator().manual_seed(0)
    n = 80
    A = torch.randn(n, 30, generator=g, dtype=torch.float64)
    A = A @ A.T  # rank 30: exercises the breakdown restart
    ref = torch.linalg.eigvalsh(A).flip(0)
    lam, U = lanczos(lambda v: A @ v, n, n, dtype=torch.float64, generator=g)
    torch.testing.assert_close(lam, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(U.T @ U, torch.eye(n, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close((U * lam) @ U.T, A, atol=1e-9, rtol=0)
    # top-k with the default number of steps (2k) on a spectrum with a decaying tail
    B = torch.randn(n, n, generator=g, dtype=torch.float64)
    Q = torch.linalg.qr(B)[0]
    ev = torch.logspace(3, -3, n, dtype=torch.float64)
    A2 = (Q * ev) @ Q.T
    lam2, U2 = lanczos(lambda v: A2 @ v, n, 10, dtype=torch.float64, generator=g)
    torch.testing.assert_close(lam2, ev[:10], rtol=1e-8, atol=0)
    torch.testing.assert_close((A2 @ U2), U2 * lam2, atol=1e-6, rtol=0)
    # block Lanczos: exact with m = n (rank-deficient: partial breakdowns), top-k with more steps
    lam3, U3 = lanczos(None, n, n, dtype=torch.float64, generator=g, block_size=7, matmat=lambda V: A @ V)
    torch.testing.assert_close(lam3, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close((U3 * lam3) @ U3.T, A, atol=1e-9, rtol=0)
    lam4, _ = lanczos(None, n, 10, 40, dtype=torch.float64, generator=g, block_size=4, matmat=lambda V: A2 @ V)
    torch.testing.assert_close(lam4, ev[:10], rtol=1e-6, atol=0)


# ------------------------------------------------------------------ low-rank k = P equals full
@pytest.fixture(scope="module")
def lowrank_pair():
    """Classification MLP with P = 191 and a rank-deficient GGN (N (C - 1) = 80 < P)."""
    model = small_mlp()
    X, y = small_data("classification")
    full = Laplace(model, "classification", subset_of_weights="all", hessian_structure="full")
    full.fit(loader(X, y, 20))
    low = Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank",
                  n_eigs=full.n_params)
    low.fit(loader(X, y))
    return model, X, y, full, low


def _priors(la):
    g = torch.Generator().manual_seed(3)
    return [0.7, torch.rand(la.n_layers, generator=g, dtype=torch.float64) + 0.3,
            torch.rand(la.n_params, generator=g, dtype=torch.float64) + 0.3]


def test_lowrank_eigvals_match_eigvalsh(lowrank_pair):
    _, _, _, full, low = lowrank_pair
    ref = torch.linalg.eigvalsh(full.H).flip(0)
    k = low.structure.eigvals.numel()
    assert 70 <= k <= 80  # rank of the GGN: N (C - 1) = 80 (generically)
    torch.testing.assert_close(low.structure.eigvals, ref[:k], rtol=1e-8, atol=1e-10)
    assert ref[k:].abs().max() < 1e-8 * ref[0]
    U, lam = low.H
    torch.testing.assert_close((U * lam) @ U.T, full.H, atol=1e-9, rtol=0)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["scalar", "layerwise", "diagonal"])
def test_lowrank_full_rank_equals_full(lowrank_pair, which):
    model, X, y, full, low = lowrank_pair
    prior = _priors(full)[which]
    for la in (full, low):
        la.prior_structure = ["scalar", "layerwise", "diagonal"][which]
        la.prior_precision = prior
    assert low.n_data == full.n_data and low.n_outputs == full.n_outputs
    torch.testing.assert_close(low.loss, full.loss)
    torch.testing.assert_close(low.log_det_posterior_precision, full.log_det_posterior_precision,
                               rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(low.log_marginal_likelihood(), full.log_marginal_likelihood(), rtol=1e-10, atol=1e-8)
    S = full.posterior_covariance
    c, pp = low.H_factor, low.prior_precision
    torch.testing.assert_close(low.structure.covariance(c, pp), S, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(low.posterior_variance, S.diagonal(), rtol=1e-8, atol=1e-10)
    V = torch.randn(low.n_params, 2, dtype=torch.float64)
    torch.testing.assert_close(low.structure.covariance_matmul(V, c, pp), S @ V, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(low.structure.dense_precision(c, pp), full.structure.precision(c, pp),
                               rtol=1e-8, atol=1e-9)
    # sampling square root: sample() is linear in the standard normals, so feed the identity
    st = low.structure
    eye = torch.eye(low.n_params, dtype=torch.float64)
    orig, st.randn = st.randn, lambda *shape, generator=None: eye
    try:
        R = st.sample(low.n_params, c, pp)  # rows = columns of the square root
    finally:
        st.randn = orig
    torch.testing.assert_close(R.T @ R, S, rtol=1e-8, atol=1e-10)
    # functional variance: from Jacobians, through la(x) (glm predictive), and matrix-free by jvp
    Xt = X[:6]
    Js = dense_jacobian(model, low, Xt)
    ref = full.functional_variance(Js)
    torch.testing.assert_close(low.functional_variance(Js), ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(low(Xt, link_approx="probit"), probit(model(Xt).detach(), ref), rtol=1e-8, atol=1e-10)
    op = ggn_operator(low)
    dinv, G = st.covariance_factors_at(c, pp)
    f, fv = functional_variance_jvp(op, Xt, dinv, G, chunk_size=4, col_chunk=50)
    torch.testing.assert_close(fv, ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(f, model(Xt))
    # marglik gradient w.r.t. the prior precision equals the full one
    grads = []
    for la in (full, low):
        lp = (prior.clone() if isinstance(prior, torch.Tensor) else torch.tensor(prior, dtype=torch.float64))
        lp = lp.log().requires_grad_(True)
        (gr,) = torch.autograd.grad(la.log_marginal_likelihood(lp.exp()), lp)
        grads.append(gr)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-8, atol=1e-10)


def test_lowrank_complete_basis_functional_variance_by_jvp_only(lowrank_pair):
    """With a complete basis (k = P), Sigma = U diag(1 / (c l + d)) U^T: jvps of U only."""
    model, X, _, full, low = lowrank_pair
    for la in (full, low):
        la.prior_structure, la.prior_precision = "scalar", 0.5
    lam, U = torch.linalg.eigh(full.H)
    _, fv = functional_variance_lowrank(ggn_operator(low), X[:5], U, 1.0 / (lam + 0.5), col_chunk=64)
    torch.testing.assert_close(fv, full.functional_variance(dense_jacobian(model, full, X[:5])),
                               rtol=1e-8, atol=1e-10)


def test_lowrank_regression_truncated_and_state_dict():
    """Regression with sigma != 1; k < P: eigenvalues are the top-k of the dense GGN, marglik
    optimisation runs, state_dict round-trips."""
    model = small_mlp(d_out=2)
    X, y = small_data("regression", d_out=2)
    full = Laplace(model, "regression", subset_of_weights="all", hessian_structure="full", sigma_noise=0.7)
    full.fit(loader(X, y, 40))
    low = Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", n_eigs=15,
                  sigma_noise=0.7)
    low.fit(loader(X, y, 40))
    ref = torch.linalg.eigvalsh(full.H).flip(0)[:15]
    torch.testing.assert_close(low.structure.eigvals, ref, rtol=1e-6, atol=0)
    # log det of the truncated posterior: exact formula with the top-15 eigenpairs
    lam = ref / 0.49 + 2.0
    expect = lam.log().sum() + (low.n_params - 15) * math.log(2.0)
    torch.testing.assert_close(low.structure.logdet(low.H_factor, torch.tensor([2.0], dtype=torch.float64)),
                               expect, rtol=1e-8, atol=0)
    low.optimize_prior_precision(n_steps=20, lr=0.1, tune_sigma_noise=True)
    assert torch.isfinite(low.log_marginal_likelihood())
    sd = low.state_dict()
    other = Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", n_eigs=15)
    other.load_state_dict(sd)
    torch.testing.assert_close(other.log_marginal_likelihood(), low.log_marginal_likelihood())
    assert low.sample(3).shape == (3, low.n_params)


# ---------------------------------------------------------------------- CG and sampling
def _exact(model, lik, X, y, prior, sigma=1.0):
    la = Laplace(model, lik, subset_of_weights="all", hessian_structure="full", prior_precision=prior,
                 sigma_noise=sigma)
    la.fit(loader(X, y))
    return la


def test_cg_solves_with_and_without_preconditioner():
    model = mlp()
    X, y = data("mlp", "classification")
    la = _exact(model, "classification", X, y, 0.3)
    op = ggn_operator(la, loader(X, y))
    A = la.posterior_precision
    B = torch.randn(la.n_params, 4, dtype=torch.float64)
    d = la.prior_precision_diag
    mm = lambda V: op.matmat(V) + d[:, None] * V  # noqa: E731
    plain = cg(mm, B, tol=1e-10)
    assert plain.converged
    torch.testing.assert_close(plain.x, torch.linalg.solve(A, B), rtol=1e-7, atol=1e-9)
    jac = cg(mm, B, tol=1e-10, precond=jacobi(A.diagonal()))
    torch.testing.assert_close(jac.x, plain.x, rtol=1e-7, atol=1e-9)
    lam, U = torch.linalg.eigh(la.H)
    pre = cg(mm, B, tol=1e-10, precond=lowrank_preconditioner(U[:, -20:], lam[-20:], 1.0, d))
    assert pre.converged and pre.n_iter < plain.n_iter
    torch.testing.assert_close(pre.x, plain.x, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("lik,prior,sigma", [("classification", "layerwise", 1.0), ("regression", "scalar", 0.5)])
def test_cg_samples_match_gaussian(lik, prior, sigma):
    """Mean and covariance of S CG samples vs the exact Gaussian, within Monte-Carlo error:
    per coordinate, mean_i ~ N(0, Sigma_ii / S) and the sample covariance entry has standard
    error sqrt((Sigma_ii Sigma_jj + Sigma_ij^2) / S); all z-scores below 5 (P^2 ~ 3.5k tests)."""
    d = D_OUT[lik]
    model = mlp(d_out=d)
    X, y = data("mlp", lik, d_out=d)
    la = _exact(model, lik, X, y, 0.5 if prior == "scalar" else torch.linspace(0.2, 2.0, 6, dtype=torch.float64),
                sigma)
    op = ggn_operator(la, loader(X, y))
    S_n = 3000
    gen = torch.Generator().manual_seed(0)
    s, res = posterior_samples(op, la.prior_precision_diag, la.H_factor, S_n, generator=gen, tol=1e-10)
    assert res.converged
    Sigma = la.posterior_covariance
    var = Sigma.diagonal()
    z_mean = s.mean(0) / (var / S_n).sqrt()
    assert z_mean.abs().max() < 5
    emp = s.T @ s / S_n  # known zero mean
    se = ((var[:, None] * var[None, :] + Sigma.square()) / S_n).sqrt()
    assert ((emp - Sigma) / se).abs().max() < 5
    # the sampled linearised predictive agrees with the closed-form glm moments
    f, fs = linearised_samples(op, X[:4], s)
    torch.testing.assert_close(f, model(X[:4]).reshape(4, -1))
    fvar = la.functional_variance(dense_jacobian(model, la, X[:4]))
    emp_f = ((fs - f).transpose(0, 1).transpose(1, 2) @ (fs - f).transpose(0, 1)) / S_n  # [N, C, C]
    fv_var = fvar.diagonal(dim1=1, dim2=2)
    se_f = ((fv_var[:, :, None] * fv_var[:, None, :] + fvar.square()) / S_n).sqrt()
    assert ((emp_f - fvar) / se_f).abs().max() < 5
    if lik == "classification":
        p = sampled_predictive(lik, fs)
        torch.testing.assert_close(p.sum(-1), torch.ones(4, dtype=torch.float64))
    else:
        m, v = sampled_predictive(lik, fs, sigma)
        assert (v >= sigma**2).all() and m.shape == (4, d)


@pytest.mark.parametrize("prior", ["scalar", "layerwise", "diagonal"])
def test_hutchinson_trace_unbiased(prior):
    """Per-probe estimates of tr(A^-1 D_g): their mean is within 4 standard errors of the exact
    trace for every group; the gradient matches autograd of the dense marglik likewise."""
    model = mlp()
    X, y = data("mlp", "classification")
    pp = {"scalar": 0.5, "layerwise": torch.linspace(0.2, 2.0, 6, dtype=torch.float64),
          "diagonal": torch.linspace(0.2, 2.0, 59, dtype=torch.float64)}[prior]
    la = _exact(model, "classification", X, y, pp)
    op = ggn_operator(la, loader(X, y))
    n_probes = 2000
    out = log_prior_precision_grad(op, la.H_factor, la.prior_precision, la.sizes, la.mean - la.prior_mean,
                                   n_probes=n_probes, generator=torch.Generator().manual_seed(0), tol=1e-10)
    d = la.prior_precision_diag
    diag_inv = (torch.linalg.inv(la.posterior_precision).diagonal() * d)
    if prior == "scalar":
        exact = diag_inv.sum()[None]
    elif prior == "layerwise":
        exact = torch.stack([t.sum() for t in torch.split(diag_inv, la.sizes)])
    else:
        exact = diag_inv
    se = out.trace_samples.std(1) / math.sqrt(n_probes)
    z = (out.trace - exact) / se.clamp_min(1e-12)
    assert z.abs().max() < (4 if prior != "diagonal" else 5)
    log_pp = la.prior_precision.detach().log().requires_grad_(True)
    (g,) = torch.autograd.grad(la.log_marginal_likelihood(log_pp.exp()), log_pp)
    assert ((out.grad - g) / out.stderr.clamp_min(1e-12)).abs().max() < (4 if prior != "diagonal" else 5)


def test_ggn_operator_batchnorm_eval_matches_dense():
    """BatchNorm (eval mode, running statistics) inside vmap-ed jvp/vjp."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(48, 3)).double()
    model[1].running_mean.uniform_(-0.5, 0.5)
    model[1].running_var.uniform_(0.5, 2.0)
    model.eval()
    X, y = data("cnn", "classification", d_out=3)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag")
    H = dense_curvature(model, la, X, y, "ggn", "classification")
    V = torch.randn(la.n_params, 2, dtype=torch.float64)
    torch.testing.assert_close(ggn_operator(la, loader(X, y, 7)) @ V, H @ V, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lik", ["classification", "regression"])
def test_lowrank_last_layer_equals_full(lik):
    d = D_OUT[lik]
    model = mlp(d_out=d)
    X, y = data("mlp", lik, d_out=d)
    out = []
    for structure in ("full", "lowrank"):
        rank = {"n_eigs": 10**6} if structure == "lowrank" else {}  # (an option of lowrank only)
        la = Laplace(model, lik, subset_of_weights="last_layer", hessian_structure=structure, **rank,
                     prior_precision=torch.linspace(0.5, 1.5, 2, dtype=torch.float64), sigma_noise=1.0)
        la.fit(loader(X, y, 5))
        if structure == "full":  # reference: dense Jacobian and the full covariance
            pred = la.functional_variance(dense_jacobian(model, la, X[:4]))
            pred = probit(model(X[:4]).detach(), pred) if lik == "classification" else pred
        else:
            pred = la(X[:4]) if lik == "classification" else la(X[:4])[1]  # regression: [B, C, C], no noise
        out.append((la.log_marginal_likelihood(), pred))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-8, atol=1e-10)
