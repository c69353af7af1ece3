"""The evidence at the mode of the linearised model (Antoran et al. 2022, recommendation 1).

The network is linearised at its trained weights ``theta_hat`` (the Laplace linearisation point,
the model's own weights, never modified):
``f_lin(x; theta) = f(x; theta_hat) + J(x) (theta - theta_hat)``. Its negative log joint

    L(theta) = c sum_n l(f_lin(x_n; theta), y_n) + 1/2 (theta - mu0)^T P0 (theta - mu0)

(``c = 1 / (sigma^2 T)`` regression, ``1 / T`` otherwise; ``l`` the likelihood's NLL with unit
noise) is convex for the Gaussian and categorical likelihoods. ``fit_linear_mode`` alternates

(a) ``theta* = argmin L`` for the current prior precision: Newton-CG, matrix-free: the gradient is
    one ``vjp`` per data chunk, the Hessian ``c sum_n J_n^T Lambda(f_lin,n) J_n + P0`` is applied by
    ``jvp`` -> output-space ``Lambda`` (``likelihood.hessian_sqrt`` at the *linearised* outputs, so
    it is the exact Hessian of ``L`` for regression and classification) -> ``vjp``, and solved by
    ``matrix_free.cg`` preconditioned with the fitted posterior at ``theta_hat`` (full: its dense
    covariance; kron: the KFAC inverse; otherwise its marginal variances); Armijo backtracking on
    ``L``; warm-started from the previous ``theta*``; ``round_newton`` caps the Newton steps per
    round (an inexact alternation: same fixed point, far fewer data passes);
(b) the prior precision (and optionally the noise) by maximising the Laplace evidence at
    ``theta*`` with L-BFGS on their logarithms (curvature fixed at ``theta_hat``: the fitted
    structure is reused, no data pass),

until the log precisions move less than ``tol`` with (a) solved (or ``n_outer`` rounds), then
re-solves (a) once for the final precision. The joint point is a stationary point of the evidence
at the mode: (b) maximises ``E(delta, theta)``, whose ``theta``-dependence is ``-L`` (curvature
fixed), so by the envelope theorem ``d E(delta, theta*(delta)) / d delta`` is (b)'s gradient.
Log precisions are kept in ``(-12, 12)`` (a smooth bound: the evidence can grow without limit in
the precision of a weight group the linear model can switch off). Afterwards ``la.mean = theta*``
(the scatter term and the centre of ``la.sample``), ``la.loss`` = the *linearised* model's summed
NLL at ``theta*`` (so ``la.log_marginal_likelihood()`` is the evidence of the linear model at its
mode), and
``la.linear_offset = theta* - theta_hat``, which the GLM predictive adds as ``J(x) offset`` to the
network output (``predictive`` calls ``linear_shift``). ``la.fit`` resets all three.

Cost (``solve_subset``): every gradient, line-search value and CG product is a pass over the
data, so on a large training set (a) runs on a seeded random subset of ``solve_subset`` rows with
their NLL scaled by ``N / solve_subset`` (an unbiased estimate of the data term; the curvature of
the fit, which sets the evidence's log-determinant and the CG preconditioner, stays the full
data's), and the final ``la.loss`` is the linearised NLL at ``theta*`` summed over all ``N`` rows
(one pass). ``None`` or ``solve_subset >= N``: the whole set. Every Newton step logs its round,
objective, CG iterations and relative residual, step size and elapsed time (``logging``, INFO).

Hand-written on ``torch.func`` through ``GGNOperator``'s helpers (no library solves the linearised
MAP matrix-free with this engine's likelihoods).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch.func import functional_call, jvp, vjp, vmap

from laplace_lab.laplace.matrix_free.cg import cg
from laplace_lab.laplace.matrix_free.ggn_operator import GGNOperator

EVIDENCE_POINTS = ("weights", "linear_mode")
LIKELIHOODS = ("classification", "regression")
log = logging.getLogger(__name__)


class LinearModeResult(NamedTuple):
    theta_star: torch.Tensor  # [P]
    n_outer: int  # alternation rounds run
    converged: bool  # log precisions moved less than tol, with the round's Newton solve converged
    log_marglik: list[float]  # evidence after every precision update
    # ||grad L(theta*)|| / ||grad L(theta_hat)|| of the linear model's objective at the final prior
    # (0 at its exact mode; ``relative_gradient``) and whether the final Newton solve stopped on its test
    grad_residual: float = math.nan
    final_solve_converged: bool = False


class LinearisedObjective:
    """``L(theta)`` of the module docstring, matrix-free, as a function of ``delta = theta - theta_hat``.
    ``scale``: factor on the data terms (NLL, its gradient and Hessian; ``N / n`` for a subset of
    ``n`` of ``N`` rows)."""

    def __init__(self, la, data: Iterable, chunk_size: int | None = None, vec_chunk: int | None = None,
                 scale: float = 1.0):
        self.la = la
        self.op = GGNOperator(la.model, la.lik, data, params=la.params, curvature="ggn",
                              chunk_size=chunk_size, vec_chunk=vec_chunk)
        self.theta_hat = torch.cat([p.detach().reshape(-1) for p in la.params])
        self.scale = scale

    def _single(self, v: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: t[0] for k, t in self.op.unflatten(v.reshape(1, -1)).items()}

    def _lin(self, X, delta):
        """``(fn, primals, f_lin [N, C])`` for one chunk."""
        fn, prim = self.op.forward_fn(X), self.op.primals()
        with torch.no_grad():
            f0, Jd = jvp(fn, (prim,), (self._single(delta),))
        return fn, prim, f0 + Jd

    def nll(self, delta: torch.Tensor) -> torch.Tensor:
        """Summed NLL (unit noise) of the linearised model at ``theta_hat + delta``."""
        total = torch.zeros((), device=self.op.device, dtype=self.op.dtype)
        for X, y in self.op.chunks():
            _, _, f = self._lin(X, delta)
            f, yy = self.op.lik.prepare(f, y)
            total = total + self.op.lik.nll(f, yy)
        return total * self.scale if self.scale != 1.0 else total

    def nll_grad(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(summed NLL, its gradient [P], Hessian factors)`` of the linearised model; the factors
        (``[K, N, C]`` per chunk, ``likelihood.hessian_sqrt`` at ``f_lin``) feed ``hessian_matmat``."""
        total = torch.zeros((), device=self.op.device, dtype=self.op.dtype)
        grad = torch.zeros(self.op.n_params, device=self.op.device, dtype=self.op.dtype)
        factors = []
        for X, y in self.op.chunks():
            fn, prim, f = self._lin(X, delta)
            ff, yy = self.op.lik.prepare(f, y)
            total = total + self.op.lik.nll(ff, yy)
            factors.append(self.op.lik.hessian_sqrt(ff))
            g = self.op.lik.grad(ff, yy).reshape(f.shape)
            with torch.no_grad():
                _, vjp_fn = vjp(fn, prim)
                grad += self.op.flatten({k: t[None] for k, t in vjp_fn(g)[0].items()})[0]
        if self.scale != 1.0:
            total, grad = total * self.scale, grad * self.scale
        return total, grad, factors

    def hessian_matmat(self, delta: torch.Tensor, V: torch.Tensor,
                       factors: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``sum_n J_n^T Lambda(f_lin,n) J_n V`` for ``V`` ``[P, s]`` (unit noise, no prior);
        ``factors`` from ``nll_grad(delta)`` save the linearised forward per chunk."""
        Vt = V.T.contiguous()
        out = torch.zeros_like(Vt)
        for i, (X, y) in enumerate(self.op.chunks()):
            if factors is None:
                fn, prim, f = self._lin(X, delta)
                F = self.op.lik.hessian_sqrt(self.op.lik.prepare(f, y)[0])  # [K, N, C]
            else:
                fn, prim, F = self.op.forward_fn(X), self.op.primals(), factors[i]
            with torch.no_grad():
                _, vjp_fn = vjp(fn, prim)
                JV = vmap(lambda t, fn=fn, prim=prim: jvp(fn, (prim,), (t,))[1], chunk_size=self.op.vec_chunk)(self.op.unflatten(Vt))
                MJV = torch.einsum("knc,bkn->bnc", F, torch.einsum("knc,bnc->bkn", F, JV))
                out += self.op.flatten(vmap(vjp_fn, chunk_size=self.op.vec_chunk)(MJV)[0])
        return (out * self.scale).T if self.scale != 1.0 else out.T


def subset_rows(data: Iterable, n: int | None, seed: int = 0) -> tuple[list, float, int]:
    """``(batches, N / n, N)``: a seeded random subset of ``n`` rows of the ``(X, y)`` batches of
    ``data`` (re-batched at the first batch's size), or ``data`` itself with scale 1 if ``n`` is
    ``None`` or at least the number of rows ``N``."""
    batches = list(data)
    total = sum(len(y) for _, y in batches)
    if n is None or n >= total:
        return batches, 1.0, total
    if n < 1:
        raise ValueError(f"solve_subset must be a positive int or None; got {n!r}")
    rows = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    X, y = torch.cat([b[0] for b in batches])[rows], torch.cat([b[1] for b in batches])[rows]
    size = len(batches[0][1])
    return [(X[i:i + size], y[i:i + size]) for i in range(0, n, size)], total / n, total


def linear_map(la, data: Iterable, delta0: torch.Tensor | None = None, *, max_newton: int = 50,
               tol: float = 1e-10, cg_tol: float = 1e-8, cg_max_iter: int | None = 200,
               chunk_size: int | None = None, vec_chunk: int | None = None,
               objective: LinearisedObjective | None = None, label: str = "") -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Newton-CG for the linearised MAP at ``la``'s current prior / noise; returns
    ``(delta* = theta* - theta_hat [P], summed NLL of the linear model at theta*, converged)``.
    Stops when the Newton decrement ``-grad^T step`` is below ``tol (1 + |L|)`` (``tol`` at least
    ``10 eps`` of the dtype: float32 sums cannot resolve less), or when the Armijo backtracking
    finds no decrease within ``2^-20`` of the Newton step (rounding level: the step is not taken).
    Logs every Newton step (INFO), prefixed by ``label``."""
    obj = objective if objective is not None else LinearisedObjective(la, data, chunk_size, vec_chunk)
    with torch.no_grad():
        c = la.H_factor.detach()
        p0 = la.prior_precision_diag.detach()
        mu0 = la.prior_mean.detach()
    th = obj.theta_hat
    precond = _preconditioner(la)
    delta = torch.zeros_like(th) if delta0 is None else delta0.detach().clone().to(th)

    def value(d, nll):
        r = th + d - mu0
        return c * nll + 0.5 * (p0 * r) @ r

    tol = max(tol, 10 * torch.finfo(th.dtype).eps)
    start = time.perf_counter()
    nll, g, Fs = obj.nll_grad(delta)
    done = False
    for k in range(max_newton):
        L = value(delta, nll)
        grad = c * g + p0 * (th + delta - mu0)
        res = cg(lambda V, delta=delta, Fs=Fs: c * obj.hessian_matmat(delta, V, Fs) + p0[:, None] * V,
                 -grad[:, None], precond=precond, tol=cg_tol, max_iter=cg_max_iter)
        step = res.x[:, 0]
        dec = -(grad @ step)
        if not dec > 0:  # CG returned no descent direction (numerically converged)
            done = True
            break
        t = 1.0
        while value(delta + t * step, obj.nll(delta + t * step)) > L - 1e-4 * t * dec:
            t *= 0.5
            if t < 2.0**-20:
                break
        log.info("linear mode %sNewton step %d: objective %.6g, decrement %.3g, CG %d iterations, relative "
                 "residual %.2e, step size %g (%.1f s)", label, k + 1, float(L), float(dec), res.n_iter,
                 float(res.rel_residual.max()), t, time.perf_counter() - start)
        if t < 2.0**-20:  # no decrease: converged to rounding level
            done = True
            break
        delta = delta + t * step
        nll, g, Fs = obj.nll_grad(delta)
        if dec <= tol * (1 + abs(float(L))):
            done = True
            break
    return delta, nll, done


def _preconditioner(la):
    """The fitted posterior covariance at ``theta_hat`` as CG preconditioner, in the structure's own
    form (``Structure.preconditioner``: e.g. the dense covariance, the KFAC inverse applied blockwise,
    or the marginal variances)."""
    with torch.no_grad():
        return la.structure.preconditioner(la.H_factor.detach(), la.structure_prior.detach())


LOG_BOUND = 12.0  # |log precision|, |log sigma| <= 12 (as online marglik's log_min / log_max)


def _bounded(u: torch.Tensor) -> torch.Tensor:
    """Smooth bijection of R onto (-LOG_BOUND, LOG_BOUND): ``B tanh(u / B)`` (the evidence may
    grow without bound in a precision, e.g. of a group the linear model switches off; the bound
    keeps L-BFGS finite and leaves every interior stationary point where it is)."""
    return LOG_BOUND * torch.tanh(u / LOG_BOUND)


def _unbounded(v: torch.Tensor) -> torch.Tensor:
    return LOG_BOUND * torch.atanh((v / LOG_BOUND).clamp(-1 + 1e-6, 1 - 1e-6))


def _maximise_evidence(la, tune_sigma_noise: bool, max_iter: int) -> float:
    """L-BFGS on the (bounded) log precisions (and log sigma); a non-finite result keeps the old values."""
    old = (la.prior_precision.detach().clone(), la.sigma_noise.detach().clone())
    u_pp = _unbounded(old[0].log()).requires_grad_(True)
    params = [u_pp]
    if tune_sigma_noise:
        u_sigma = _unbounded(old[1].log()).requires_grad_(True)
        params.append(u_sigma)
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -la.log_marginal_likelihood(_bounded(u_pp).exp(), _bounded(u_sigma).exp() if tune_sigma_noise else None)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        la.prior_precision = _bounded(u_pp).exp()
        if tune_sigma_noise:
            la.sigma_noise = _bounded(u_sigma).exp()
        value = float(la.log_marginal_likelihood())
        if not math.isfinite(value):
            la.prior_precision, la.sigma_noise = old
            value = float(la.log_marginal_likelihood())
    return value


def fit_linear_mode(la, train_loader: Iterable, n_outer: int = 20, tol: float = 1e-4,
                    optimize_prior: bool = True, tune_sigma_noise: bool = False, prior_max_iter: int = 100,
                    max_newton: int = 50, newton_tol: float = 1e-10, cg_tol: float = 1e-8,
                    cg_max_iter: int | None = 200, chunk_size: int | None = None,
                    vec_chunk: int | None = None, round_newton: int | None = None,
                    solve_subset: int | None = None, seed: int = 0) -> LinearModeResult:
    """Joint linear mode and prior precision (module docstring) for a fitted ``la``.

    ``train_loader``: re-iterable ``(X, y)`` batches (the data ``la`` was fitted on); iterated once
    per gradient / Hessian-vector product. ``optimize_prior=False``: only solve for ``theta*`` at
    the current precision. ``tune_sigma_noise``: also the noise (regression). ``round_newton``:
    Newton steps per alternation round (``None``: solve (a) to ``newton_tol`` every round; e.g. 1:
    interleave single Newton steps with the precision updates, which reaches the same joint
    stationary point in far fewer data passes; the final solve (a) always runs to ``newton_tol``).
    ``solve_subset``: rows (seeded by ``seed``) that (a) is solved on (module docstring, "Cost").
    Sets ``la.mean``, ``la.loss``, ``la.linear_offset``; the prior (and noise) end at the last update."""
    la.check_fitted()
    if la.likelihood not in LIKELIHOODS:
        raise ValueError(f"fit_linear_mode supports likelihood in {LIKELIHOODS} (convex linearised loss); "
                         f"got {la.likelihood!r}")
    if tune_sigma_noise and la.likelihood != "regression":
        raise ValueError("tune_sigma_noise needs likelihood='regression'")
    if not (isinstance(n_outer, int) and n_outer >= 1):
        raise ValueError(f"n_outer must be a positive int; got {n_outer!r}")
    if solve_subset is not None and not (isinstance(solve_subset, int) and solve_subset >= 1):
        raise ValueError(f"solve_subset must be a positive int or None; got {solve_subset!r}")
    was_training = la.model.training
    la.model.eval()
    try:
        solve_data, scale, n_rows = subset_rows(train_loader, solve_subset, seed)
        if scale != 1.0:
            log.info("linear mode: solving on %d of %d training rows (NLL scaled by %.3g)", solve_subset, n_rows, scale)
        obj = LinearisedObjective(la, solve_data, chunk_size, vec_chunk, scale=scale)
        delta = la.linear_offset if la.linear_offset is not None else None
        kw = dict(max_newton=max_newton, tol=newton_tol, cg_tol=cg_tol, cg_max_iter=cg_max_iter, objective=obj)
        history, converged, rounds = [], False, 0
        if optimize_prior:
            per_round = kw | ({"max_newton": min(round_newton, max_newton)} if round_newton else {})
            for rounds in range(1, n_outer + 1):  # noqa: B007 - rounds is reported
                delta, nll, solved = linear_map(la, solve_data, delta, **per_round, label=f"round {rounds}/{n_outer}, ")
                _set(la, obj, delta, nll)
                old = [la.prior_precision.detach().log().clone(), la.sigma_noise.detach().log().clone()]
                history.append(_maximise_evidence(la, tune_sigma_noise, prior_max_iter))
                moved = max(float((la.prior_precision.detach().log() - old[0]).abs().max()),
                            float((la.sigma_noise.detach().log() - old[1]).abs()))
                log.info("linear mode round %d/%d: log evidence %.6g, log precisions moved %.3g (tol %g)",
                         rounds, n_outer, history[-1], moved, tol)
                if (moved < tol and solved) or not math.isfinite(history[-1]):
                    converged = math.isfinite(history[-1])
                    break
        delta, nll, final_done = linear_map(la, solve_data, delta, **kw, label="final solve, ")
        residual = relative_gradient(la, obj, delta)
        log.info("linear mode final solve: relative gradient residual %.2e (converged: %s)", residual, final_done)
        if scale != 1.0:  # the evidence's data term over all rows at theta*
            nll = LinearisedObjective(la, train_loader, chunk_size, vec_chunk).nll(delta)
        _set(la, obj, delta, nll)
    finally:
        la.model.train(was_training)
    return LinearModeResult(la.mean.clone(), rounds, converged, history, residual, bool(final_done))


def relative_gradient(la, obj: LinearisedObjective, delta: torch.Tensor) -> float:
    """``||grad L(theta_hat + delta)|| / ||grad L(theta_hat)||`` of the linear model's objective
    ``L`` (module docstring) at ``la``'s current prior and noise: how far ``delta`` is from the linear
    mode (0 there), relative to the linearisation point. Two gradient passes over ``obj``'s data."""
    with torch.no_grad():
        c = la.H_factor.detach()
        p0 = la.prior_precision_diag.detach()
        mu0 = la.prior_mean.detach()
        th = obj.theta_hat

        def grad(d):
            return c * obj.nll_grad(d)[1] + p0 * (th + d - mu0)

        return float(grad(delta).norm() / grad(torch.zeros_like(delta)).norm().clamp_min(torch.finfo(th.dtype).tiny))


def _set(la, obj: LinearisedObjective, delta: torch.Tensor, nll: torch.Tensor) -> None:
    la.linear_offset = delta.detach()
    la.mean = obj.theta_hat + la.linear_offset
    la.loss = nll.detach()


def linear_shift(la, x: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``J(x) offset`` ``[B, C]`` at the network's weights (one ``jvp``; differentiable in ``x``
    when it requires grad)."""
    names = {id(p): n for n, p in la.model.named_parameters()}
    keys = [names[id(p)] for p in la.params]
    prim = {k: p.detach() for k, p in zip(keys, la.params)}
    tang = {k: c.reshape(p.shape).to(p) for k, c, p in zip(keys, torch.split(offset, la.sizes), la.params)}

    def fn(p):
        out = functional_call(la.model, p, (x,), strict=False)
        return out.reshape(out.shape[0], -1)

    return jvp(fn, (prim,), (tang,))[1]


__all__ = ["EVIDENCE_POINTS", "LinearModeResult", "LinearisedObjective", "linear_map", "fit_linear_mode",
           "relative_gradient",
           "linear_shift"]
