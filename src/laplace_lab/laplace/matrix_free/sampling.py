"""Sample-based linearised Laplace (sample-then-optimise; Antoran et al. 2023 style) and a
stochastic estimate of the evidence's gradient. Hand-written on ``GGNOperator`` and ``cg``.

Posterior of the linearised model around ``theta_MAP`` with precision ``A = c H + D``
(``D = diag(prior)``, prior mean 0 for the sample, which is zero-mean around ``theta_MAP``):
``x = A^-1 (sqrt(c) J^T M^{1/2} eps1 + D^{1/2} eps2)`` with ``eps1, eps2 ~ N(0, I)`` has
``Cov[rhs] = c H + D = A``, so ``Cov[x] = A^-1`` exactly; the solve is batched CG over the
samples (``H`` is never formed; each CG step is one data pass of batched GGN products). Antoran
et al. solve the same quadratic by SGD; CG converges in far fewer data passes on small-to-medium
problems and has a preconditioner hook (``jacobi``, ``lowrank_preconditioner`` from a Lanczos fit).

Evidence gradient w.r.t. log prior precision ``delta_g`` of group ``g`` (scalar: all weights;
layerwise: one parameter tensor; diagonal: one weight), with ``D_g = dD / dlog delta_g``:
``d logML / dlog delta_g = 1/2 n_g - 1/2 delta_g ||theta_g||^2 - 1/2 tr(A^-1 D_g)``;
the trace by Hutchinson, ``tr(A^-1 D_g) = E_z[sum_{i in g} delta_g z_i (A^-1 z)_i]`` with
Rademacher ``z`` (all groups from the same CG solves); the scatter and ``n_g`` terms are exact.
Unbiased up to the CG tolerance; the returned standard error is the probes' sample std / sqrt(S).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from laplace_lab.laplace.likelihoods import HeteroscedasticRegression
from laplace_lab.laplace.matrix_free.cg import CGResult, cg
from laplace_lab.laplace.matrix_free.ggn_operator import GGNOperator
from laplace_lab.laplace.matrix_free.lowrank import covariance_factors
from laplace_lab.laplace.priors import to_diag


def ggn_operator(la, data: Iterable | None = None, chunk_size: int | None = None,
                 vec_chunk: int | None = None) -> GGNOperator:
    """``GGNOperator`` of a ``Laplace`` object's subset, likelihood and curvature over ``data``
    (``None``: the operator of a fitted ``hessian_structure="lowrank"`` Laplace)."""
    if data is None:
        op = getattr(la.structure, "op", None)
        if op is None:
            raise ValueError("data is required unless la is a fitted hessian_structure='lowrank' Laplace")
        return op
    return GGNOperator(la.model, la.lik, data, params=la.params, curvature=la.curvature,
                       chunk_size=chunk_size, vec_chunk=vec_chunk)


def precision_matmat(op: GGNOperator, c, prior_diag: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``X [P, b] -> (c H + diag(prior_diag)) X``."""
    return lambda X: c * op.matmat(X) + prior_diag[:, None] * X


def lowrank_preconditioner(U: torch.Tensor, eigvals: torch.Tensor, c, prior_diag: torch.Tensor):
    """``R -> (c U diag(eigvals) U^T + D)^-1 R`` (Woodbury; e.g. from a lowrank fit)."""
    dinv, G = covariance_factors(U, eigvals, c, prior_diag)
    return lambda R: dinv[:, None] * R - G @ (G.T @ R)


def posterior_samples(op: GGNOperator, prior_diag: torch.Tensor, c=1.0, n_samples: int = 100,
                      generator: torch.Generator | None = None, precond=None, tol: float = 1e-6,
                      max_iter: int | None = None) -> tuple[torch.Tensor, CGResult]:
    """``[n_samples, P]`` zero-mean draws from ``N(0, (c H + D)^-1)`` by batched CG, and the
    ``CGResult`` (iterations = data passes). Add ``la.mean`` for weight samples."""
    if not (isinstance(n_samples, int) and n_samples >= 1):
        raise ValueError(f"n_samples must be a positive int; got {n_samples!r}")
    P = op.n_params
    prior_diag = prior_diag.to(op.device, op.dtype).expand(P)
    c = torch.as_tensor(c, device=op.device, dtype=op.dtype)
    eps2 = torch.randn(P, n_samples, generator=generator, device=op.device, dtype=op.dtype)
    rhs = c.sqrt() * op.jt_msqrt(n_samples, generator) + prior_diag.sqrt()[:, None] * eps2
    res = cg(precision_matmat(op, c, prior_diag), rhs, precond=precond, tol=tol, max_iter=max_iter)
    return res.x.T, res


def linearised_samples(op: GGNOperator, X: torch.Tensor, samples: torch.Tensor,
                       chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Linearised-network function samples at ``X``: ``(f_MAP [N, C], f_MAP + J s [S, N, C])``
    for zero-mean weight samples ``s`` ``[S, P]`` (``jvp`` batched over samples)."""
    step = chunk_size or X.shape[0]
    fs, outs = [], []
    for i in range(0, X.shape[0], step):
        f, JS = op.jvp(X[i:i + step].to(op.device), samples)
        fs.append(f)
        outs.append(f + JS)
    return torch.cat(fs), torch.cat(outs, 1)


def sampled_predictive(likelihood: str, f_samples: torch.Tensor, sigma_noise=1.0):
    """Predictive from function samples ``[S, N, C]``: classification -> probabilities ``[N, C]``;
    regression -> ``(mean, var)`` ``[N, C]`` (var includes ``sigma^2``); heteroscedastic ->
    ``(mean, var)`` ``[N, D]`` by the law of total variance."""
    if likelihood == "classification":
        return f_samples.softmax(-1).mean(0)
    if likelihood == "regression":
        return f_samples.mean(0), f_samples.var(0, unbiased=False) + torch.as_tensor(sigma_noise) ** 2
    if likelihood == "heteroscedastic_regression":
        m, v = torch.vmap(HeteroscedasticRegression.mean_var)(f_samples)
        return m.mean(0), v.mean(0) + m.var(0, unbiased=False)
    raise ValueError(f"likelihood must be one of ('classification', 'regression', "
                     f"'heteroscedastic_regression'); got {likelihood!r}")


class LogPriorGrad(NamedTuple):
    grad: torch.Tensor  # [G] estimate of d logML / d log delta_g
    stderr: torch.Tensor  # [G] Monte-Carlo standard error of grad
    trace: torch.Tensor  # [G] estimate of tr(A^-1 D_g)
    trace_samples: torch.Tensor  # [G, S] per-probe trace estimates
    cg: CGResult


def _group_sum(X: torch.Tensor, prior: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Rows of ``X`` ``[P, ...]`` summed per prior group -> ``[G, ...]``."""
    if prior.numel() == 1:
        return X.sum(0, keepdim=True)
    if prior.numel() == len(sizes):
        return torch.stack([x.sum(0) for x in torch.split(X, sizes)])
    return X


def log_prior_precision_grad(op: GGNOperator, c, prior: torch.Tensor, sizes: list[int], theta: torch.Tensor,
                             n_probes: int = 10, generator: torch.Generator | None = None, precond=None,
                             tol: float = 1e-6, max_iter: int | None = None) -> LogPriorGrad:
    """Stochastic gradient of the Laplace evidence w.r.t. ``log prior`` (``prior`` ``[1]``, ``[L]``
    with ``sizes`` the ``L`` tensor sizes, or ``[P]``); ``theta`` = ``mean - prior_mean`` ``[P]``.
    For a ``Laplace`` object: ``(ggn_operator(la, loader), la.H_factor, la.prior_precision,
    la.sizes, la.mean - la.prior_mean)``."""
    if not (isinstance(n_probes, int) and n_probes >= 1):
        raise ValueError(f"n_probes must be a positive int; got {n_probes!r}")
    P = op.n_params
    prior = prior.to(op.device, op.dtype).reshape(-1)
    if prior.numel() not in (1, len(sizes), P):
        raise ValueError(f"prior must have 1, {len(sizes)} (layerwise) or {P} (diagonal) entries")
    d = to_diag(prior, sizes)
    Z = torch.randint(0, 2, (P, n_probes), generator=generator, device=op.device).to(op.dtype) * 2 - 1
    res = cg(precision_matmat(op, c, d), Z, precond=precond, tol=tol, max_iter=max_iter)
    per = _group_sum(Z * res.x * d[:, None], prior, sizes)  # [G, S]
    trace = per.mean(1)
    se = per.std(1) / math.sqrt(n_probes) if n_probes > 1 else torch.full_like(trace, math.inf)
    n_g = _group_sum(torch.ones(P, 1, device=op.device, dtype=op.dtype), prior, sizes)[:, 0]
    scatter = _group_sum((d * theta.to(op.dtype).square())[:, None], prior, sizes)[:, 0]
    grad = 0.5 * n_g - 0.5 * scatter - 0.5 * trace
    return LogPriorGrad(grad, 0.5 * se, trace, per, res)


__all__ = ["ggn_operator", "precision_matmat", "lowrank_preconditioner", "posterior_samples",
           "linearised_samples", "sampled_predictive", "log_prior_precision_grad", "LogPriorGrad"]
