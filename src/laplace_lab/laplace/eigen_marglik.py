"""The log marginal likelihood of a fitted Laplace as a cheap function of its hyperparameters.

Hand-written (no library has it). Online marglik (Immer et al. 2021) takes ``K`` (e.g. 100) Adam
steps on the log prior precisions (and, for regression, the log noise std) after each fit.
``Laplace.log_marginal_likelihood`` rebuilds every per-block eigenvalue matrix, the ``[P]``
per-parameter prior and the scatter on each call (and goes through the prior setter's checks), a
few milliseconds per step on LeNet-5 -- 100 steps cost a fifth of a training epoch. For the kron
and diag structures the posterior precision is diagonal in a fixed eigenbasis, so

    log det (c H + P0) = sum_i log(c h_i + delta_{b(i)})

with ``h`` the ``[P]`` eigenvalues of ``H`` (kron: ``lamG (x) lamA`` per weight, ``lamG`` per
bias; diag: ``diag(H)``) and ``b(i)`` the prior group of eigenvalue ``i``. ``EigenMarglik``
takes ``h``, the per-group sizes and squared distances to the prior mean once per fit. Calling it
gives the value (differentiable by autograd); ``grad_log`` gives the gradient w.r.t. the log
hyperparameters in closed form without the value -- one reciprocal and a few sums over the
``[P]`` eigenvalues, no ``log`` and no autograd -- which is all that an Adam step needs:

    d/d log delta_g = -1/2 (delta_g sum_{i in g} 1 / x_i - n_g + delta_g |theta_g - mu0_g|^2),
    d/d log sigma   = c (2 loss + sum_i h_i / x_i) - N C       (regression; c = 1 / (sigma^2 T)),

with ``x_i = c h_i + delta_{g(i)}``.

Conventions are the engine's (``Laplace.log_marginal_likelihood``): ``c = 1 / (sigma^2 T)`` for
regression, ``1 / T`` otherwise; log likelihood ``-c loss`` (regression also ``- N C log(sigma
sqrt(2 pi))``); scatter ``(theta - mu0)^T P0 (theta - mu0)`` at ``la.mean``. ``EigenMarglik(la)``
checks itself against ``la.log_marginal_likelihood`` at the current hyperparameters and raises
``ValueError`` if they disagree (a convention changed in the engine); ``supports(la)`` tells which
fits it handles: any structure with ``curvature_eigenvalues()`` (built in: kron with scalar /
layerwise / normgroups priors, diag with any prior).

``FullMarglik`` is the same for structures with a dense Cholesky (``dense_cholesky``: full), where no basis diagonalises ``c H + P0`` for
every prior (a layerwise prior is not a multiple of the identity): each gradient takes one
Cholesky factor ``L`` of ``x = c H + P0`` (float64, as the engine) and ``diag(x^{-1})`` from
``cholesky_inverse(L)``; the sums over ``1 / x_i`` above become sums over that diagonal, and
``c sum_i h_i / x_i`` becomes ``c tr(x^{-1} H) = P - sum_i delta_i (x^{-1})_ii``. One factorisation
per step, against a Cholesky and its autograd backward (several times the cost) through
``Laplace.log_marginal_likelihood``.

When one prior group ``b`` holds most parameters (a layerwise prior on an MLP: the first layer),
``FullMarglik`` instead eigendecomposes ``H = U diag(lam) U^T`` once per fit and writes
``x = A + S D S^T`` with ``A = c H + delta_b I`` (diagonal in ``U``) and ``S D S^T`` the diagonal
correction ``delta_g - delta_b`` on the ``r`` parameters outside ``b``. By Woodbury,

    x^{-1} = A^{-1} - A^{-1} S D (I + K D)^{-1} S^T A^{-1},   K = S^T A^{-1} S  [r, r],

so ``diag(x^{-1})`` costs ``O(P^2 r)`` per step (``A^{-1} S = U diag(1 / (c lam + delta_b)) U_S^T``)
instead of a ``P^3`` factorisation; ``r = 0`` (a scalar prior) is the plain eigenbasis. Used when
``r <= P / 2``; a non-finite or non-positive result falls back to the Cholesky (which raises for
an indefinite precision, as before). Equal to the Cholesky path to rounding (float64 tests).
"""

from __future__ import annotations

import functools
import math

import torch


def _plain_fit(la) -> bool:
    return la.fitted and getattr(la, "linear_offset", None) is None


def supports(la) -> bool:
    """Whether ``EigenMarglik`` handles ``la``: fitted, no linear-mode offset, and its structure has
    ``curvature_eigenvalues()`` (an eigenbasis shared with its priors; built in: kron, diag)."""
    return _plain_fit(la) and la.structure.curvature_eigenvalues() is not None


def supports_full(la) -> bool:
    """Whether ``FullMarglik`` handles ``la``: fitted, no linear-mode offset, and its structure factorises
    a dense precision (``dense_cholesky``; built in: full)."""
    return _plain_fit(la) and la.structure.dense_cholesky


def closed_form(la, **kwargs):
    """The fast marglik the structure of ``la`` provides: ``EigenMarglik(la)`` (an eigenbasis),
    ``FullMarglik(la)`` (a dense Cholesky) or ``None``."""
    if supports(la):
        return EigenMarglik(la, **kwargs)
    if supports_full(la):
        return FullMarglik(la, **kwargs)
    return None


class EigenMarglik:
    """``(prior_precision, sigma_noise) -> log marglik`` of the fitted ``la`` in ``O(P)`` per call.

    ``prior_precision``: the shape ``la.prior_precision`` takes (``[1]``, ``[n_layers]``,
    ``[n_groups]`` for normgroups, ``[P]`` for a diagonal prior on the diag structure);
    ``sigma_noise``: 0-dim (regression; ``None`` keeps ``la.sigma_noise``). Both may carry a graph.
    ``la`` itself is not modified. ``check``: compare with ``la.log_marginal_likelihood`` once.
    """

    def __init__(self, la, check: bool = True, rtol: float | None = None):
        if not self._supports(la):
            raise ValueError(self._refusal)
        self.la = la
        self.prior_structure = la.prior_structure
        self.regression = la.likelihood == "regression"
        self.temperature = la.temperature
        self.dtype, device = la.dtype, la.device
        with torch.no_grad():
            h = self._eigenvalues(la)
            diff2 = (la.mean - la.prior_mean).square().to(self.dtype).expand(la.n_params)  # [P]
            self.loss = la.loss.detach().to(self.dtype)
        self.n_params = la.n_params
        self.n_norm = la.n_data * (la.n_outputs or 1)
        self.sigma_noise = la.sigma_noise.detach()
        self.order = self.index = None
        self.one_kernel = False
        groups = la.prior.tensor_index()  # [n_layers] entry of the prior values per tensor; None: diagonal
        if groups is None:  # one precision per parameter: no groups
            self.split = None
            self.h, self.diff2 = h, diff2
        else:  # group of every parameter: 0 (scalar), its tensor (layerwise) or its tensor's group (normgroups)
            n_layers = len(la.sizes)
            groups = groups.detach().cpu().long()
            self.n_groups = int(groups.max()) + 1 if n_layers else 1
            index = torch.repeat_interleave(groups, torch.as_tensor(la.sizes)).to(device)  # [P]
            # the sums are order-free: sort the eigenvalues by group once, so that a call expands the
            # group precisions by views + one copy (a [P] gather is several times slower on CPU)
            order = torch.argsort(index, stable=True)
            self.h = h[order].contiguous() if h is not None else None
            self.order, self.index = order, index
            counts = torch.bincount(index, minlength=self.n_groups)
            self.lengths = counts  # on the device: one-kernel expansions and group sums there
            self.one_kernel = counts.is_cuda  # see _expand
            self.split = counts.tolist()
            self.group_sizes = counts.to(self.dtype)
            self.group_diff2 = torch.zeros(self.n_groups, dtype=self.dtype, device=device).index_add_(0, index, diff2)
        if check:
            self.verify(rtol if rtol is not None else (1e-10 if self.dtype == torch.float64 else 1e-4))

    def verify(self, rtol: float) -> None:
        """``ValueError`` unless the value at ``la``'s current hyperparameters equals ``la.log_marginal_likelihood()``."""
        la = self.la
        with torch.no_grad():
            prior = la.prior_precision.detach().clone()
            sigma = la.sigma_noise.detach().clone() if self.regression else None
            ref = float(la.log_marginal_likelihood())
            mine = float(self(prior, sigma))
        if not math.isclose(ref, mine, rel_tol=rtol, abs_tol=rtol):
            raise ValueError(f"EigenMarglik disagrees with Laplace.log_marginal_likelihood: {mine} vs {ref}")

    # ---- structure-specific pieces ---------------------------------------------------------------
    _supports = staticmethod(supports)
    _refusal = ("EigenMarglik needs a fitted Laplace whose structure has curvature_eigenvalues() "
                "(e.g. hessian_structure 'kron' or 'diag') and no linear-mode offset")

    def _eigenvalues(self, la) -> torch.Tensor:
        """``[P]`` eigenvalues of ``H`` in parameter order (no grad)."""
        h = la.structure.curvature_eigenvalues().reshape(-1)
        if h.numel() != la.n_params:
            raise ValueError(f"EigenMarglik: {h.numel()} eigenvalues for {la.n_params} parameters")
        return h.to(self.dtype)

    def _logdet_post(self, delta: torch.Tensor, c) -> torch.Tensor:
        """``log det(c H + P0)`` (autograd through ``delta`` and ``c``)."""
        return torch.log(self._expand(delta) + c * self.h).sum()

    def _inverse_diag(self, delta: torch.Tensor, c) -> torch.Tensor:
        """``[P]`` diagonal of ``(c H + P0)^{-1}`` in the eigenbasis, group-sorted (no grad)."""
        return self._expand(delta).add(self.h * c).reciprocal_()

    def _sigma_terms(self, inv: torch.Tensor, delta: torch.Tensor, c) -> torch.Tensor:
        """``c (2 loss + tr((c H + P0)^{-1} H))`` given ``inv = _inverse_diag(delta, c)``."""
        return c * (2 * self.loss + (self.h * inv).sum())

    # ---- pieces -------------------------------------------------------------------------------
    def _delta(self, prior: torch.Tensor) -> torch.Tensor:
        """``[n_groups]`` (or ``[P]`` for a diagonal prior) precisions."""
        prior = prior.to(self.dtype).reshape(-1)
        want = self.n_params if self.split is None else self.n_groups
        if prior.numel() == 1 and want != 1:
            prior = prior.expand(want)
        if prior.numel() != want:
            raise ValueError(f"prior_precision has {prior.numel()} entries; expected {want}")
        return prior

    def _expand(self, delta: torch.Tensor) -> torch.Tensor:
        """``[n_groups]`` -> ``[P]`` group-sorted (the identity for a diagonal prior). ``one_kernel``
        (CUDA): one kernel without a host synchronisation; else views + one copy (measured faster on
        the CPU than ``repeat_interleave`` or a gather)."""
        if self.split is None:
            return delta
        if self.one_kernel:
            return torch.repeat_interleave(delta, self.lengths, output_size=self.n_params)
        return torch.cat([d.expand(n) for d, n in zip(delta.unbind(), self.split)])

    def _group_sums(self, x: torch.Tensor) -> torch.Tensor:
        """``[P]`` group-sorted -> ``[n_groups]`` sums (``one_kernel``: one kernel, no host synchronisation)."""
        if self.one_kernel:
            return torch.segment_reduce(x, "sum", lengths=self.lengths, unsafe=True)
        return torch.stack([part.sum() for part in x.split(self.split)])

    def _scale(self, sigma_noise):
        """``(c, sigma)``: curvature scale and the noise std (regression) or ``None``."""
        if not self.regression:
            if sigma_noise is not None:
                raise ValueError("sigma_noise can only be set for likelihood='regression'")
            return 1.0 / self.temperature, None
        sigma = (sigma_noise if sigma_noise is not None else self.sigma_noise).to(self.dtype).reshape(())
        return 1.0 / (sigma.square() * self.temperature), sigma

    # ---- value (autograd) ----------------------------------------------------------------------
    def __call__(self, prior_precision: torch.Tensor, sigma_noise: torch.Tensor | None = None) -> torch.Tensor:
        c, sigma = self._scale(sigma_noise)
        loglik = -c * self.loss
        if sigma is not None:
            loglik = loglik - self.n_norm * torch.log(sigma * math.sqrt(2 * math.pi))
        delta = self._delta(prior_precision)
        logdet_post = self._logdet_post(delta, c)
        if self.split is None:
            logdet_prior, scatter = delta.log().sum(), (delta * self.diff2).sum()
        else:
            logdet_prior, scatter = (self.group_sizes * delta.log()).sum(), (delta * self.group_diff2).sum()
        return loglik - 0.5 * (logdet_post - logdet_prior + scatter)

    # ---- gradient (closed form) -------------------------------------------------------------------
    @torch.no_grad()
    def grad_log(self, log_prior: torch.Tensor, log_sigma: torch.Tensor | None = None):
        """``(d/d log_prior, d/d log_sigma or None)`` of the log marglik at ``exp(log_prior)``,
        ``exp(log_sigma)``; shapes (and dtypes) of the arguments. No value, no autograd."""
        lp = log_prior.detach().to(self.dtype)
        delta = self._delta(lp.exp())
        sigma = log_sigma.detach().to(self.dtype).exp() if log_sigma is not None else None
        c, sigma = self._scale(sigma)
        inv = self._inverse_diag(delta, c)  # 1 / x_i (full: diag of x^{-1})
        if self.split is None:
            g = -0.5 * (delta * inv - 1.0 + delta * self.diff2)
        else:
            S = self._group_sums(inv)
            g = -0.5 * (delta * S - self.group_sizes + delta * self.group_diff2)
            if lp.numel() == 1 and self.n_groups != 1:  # one precision shared by all groups
                g = g.sum().reshape(1)
        g_sigma = None
        if log_sigma is not None:
            if sigma is None:
                raise ValueError("log_sigma can only be given for likelihood='regression'")
            # dL/dlog sigma = (dL/dc)(dc/dlog sigma) - N C,  dL/dc = -loss - 1/2 sum h / x,  dc/dlog sigma = -2 c
            g_sigma = (self._sigma_terms(inv, delta, c) - self.n_norm).reshape(log_sigma.shape)
            g_sigma = g_sigma.to(log_sigma.dtype)
        return g.reshape(log_prior.shape).to(log_prior.dtype), g_sigma


class FullMarglik(EigenMarglik):
    """``EigenMarglik`` for the full structure: same interface and conventions; each call factorises
    ``c H + P0`` once (``la``'s float64 ``H`` through its structure's ``cholesky``), since no fixed
    basis diagonalises it for a non-scalar prior. A non-positive-definite precision raises
    ``torch.linalg.LinAlgError`` as in the engine."""

    _supports = staticmethod(supports_full)
    _refusal = ("FullMarglik needs a fitted Laplace whose structure has a dense Cholesky (dense_cholesky, e.g. "
                "hessian_structure 'full') and no linear-mode offset")

    def _eigenvalues(self, la):
        return None

    def _param_delta(self, delta: torch.Tensor) -> torch.Tensor:
        """``[P]`` per-parameter precisions in parameter order."""
        if self.split is None:
            return delta
        return delta[self.index]

    def _cholesky(self, delta: torch.Tensor, c) -> torch.Tensor:
        return self.la.structure.cholesky(c, self._param_delta(delta))

    def _logdet_post(self, delta, c):
        return (2 * self._cholesky(delta, c).diagonal().log().sum()).to(self.dtype)

    @torch.no_grad()
    def inverse_diagonal(self, prior_precision: torch.Tensor, sigma_noise: torch.Tensor | None = None) -> torch.Tensor:
        """``[P]`` float64 ``diag((c H + P0)^{-1})`` in parameter order at ``prior_precision`` (the
        shapes ``__call__`` takes) and ``sigma_noise`` (regression; ``None``: ``la``'s), by the path
        ``low_rank`` names; ``torch.linalg.LinAlgError`` for an indefinite precision."""
        c, _ = self._scale(sigma_noise)
        return self._inverse_diag64(self._delta(prior_precision), c)

    @property
    def low_rank(self) -> int | None:
        """Rank ``r`` of the Woodbury correction of the eigenbasis path (0: a scalar prior), or
        ``None`` when each step factorises (a diagonal prior, or ``r > P / 2``)."""
        return None if self._woodbury is None else int(self._woodbury[1].numel())

    def _inverse_diag(self, delta, c):
        d = self._inverse_diag64(delta, c).to(self.dtype)
        return d if self.order is None else d[self.order]

    def _inverse_diag64(self, delta, c):
        d = self._woodbury_diag(delta, c)
        return torch.cholesky_inverse(self._cholesky(delta, c)).diagonal() if d is None else d

    @functools.cached_property
    def _woodbury(self):
        """Once per fit: ``(base group, parameters outside it, lam, U, U^2, U[rest])`` of the
        eigendecomposition of ``H``, or ``None`` when the low-rank form does not pay."""
        if self.split is None or not hasattr(self.la.structure, "curvature_eigh"):
            return None
        base = int(torch.argmax(torch.as_tensor(self.split)))
        rest = torch.nonzero(self.index != base).reshape(-1)  # parameter order
        if 2 * rest.numel() > self.n_params:
            return None
        lam, U = self.la.structure.curvature_eigh()
        return base, rest, lam, U, U.square(), U[rest]

    def _woodbury_diag(self, delta, c):
        """``[P]`` float64 ``diag(x^{-1})`` in parameter order by the eigenbasis + Woodbury form (module
        docstring), or ``None`` (not applicable, or a non-finite / non-positive result)."""
        if self._woodbury is None:
            return None
        base, rest, lam, U, U2, U_rest = self._woodbury
        pd = self._param_delta(delta).to(torch.float64)
        d_base = delta.reshape(-1)[base].to(torch.float64)
        w = (torch.as_tensor(c).double() * lam + d_base).reciprocal()  # [P] eigenvalues of A^{-1} (c as the engine casts it)
        d = U2 @ w  # diag(A^{-1})
        if rest.numel():
            AS = (U * w) @ U_rest.T  # [P, r] = A^{-1} S
            D = pd[rest] - d_base  # [r]
            M = torch.eye(rest.numel(), dtype=torch.float64, device=AS.device) + AS[rest] * D  # I + K D
            Z = torch.linalg.solve(M, AS.T)  # [r, P] = (I + K D)^{-1} S^T A^{-1}
            d = d - ((AS * D) * Z.T).sum(1)
        if not (torch.isfinite(d).all() and (d > 0).all()):
            return None
        return d

    def _sigma_terms(self, inv, delta, c):  # c tr(x^{-1} H) = tr(x^{-1} (x - P0)) = P - sum_i delta_i x^{-1}_ii
        return 2 * c * self.loss + self.n_params - (self._expand(delta) * inv).sum()
