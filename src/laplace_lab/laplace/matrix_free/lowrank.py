"""Low-rank posterior (``hessian_structure="lowrank"``): top-``k`` GGN eigenpairs by Lanczos.

Hand-written (no maintained library has a low-rank Laplace posterior over our likelihoods and
structures' interface). Fit (``LowRankStructure.fit``, dispatched from ``Laplace.fit``): one
forward pass for the loss, then ``m`` Lanczos steps on the matrix-free ``GGNOperator`` (one data
pass each); ``H ~= U diag(l) U^T`` with ``U`` ``[P, k]`` orthonormal, ``l`` ``[k] >= 0``
(eigenvalues below ``rtol * max(l)``, default ``100 eps``, are dropped as numerical zeros, so
``k`` may shrink for a rank-deficient GGN).

Posterior precision ``P = c U diag(l) U^T + D`` with ``D = diag(prior)`` (scalar, layerwise or
diagonal prior; the GGN's rank-k truncation is the only approximation, the prior is exact):

- scalar prior ``delta``: eigenvalues ``c l + delta`` on span(U), ``delta`` elsewhere:
  ``log det P = sum log(c l + delta) + (P - k) log delta``;
  ``Sigma = I / delta - G G^T`` with ``G = U sqrt(1/delta - 1/(c l + delta))``.
- layerwise / diagonal prior: ``W = U sqrt(c l)``, ``M = I_k + W^T D^-1 W`` (Cholesky ``L_M``):
  ``log det P = log det D + log det M`` (matrix determinant lemma) and, by Woodbury,
  ``Sigma = D^-1 - G G^T`` with ``G = D^-1 W L_M^-T``. Note: Lanczos finds the top eigenpairs of
  ``H``, not of ``D^-1/2 H D^-1/2``, so with a strongly non-uniform prior the rank-k truncation is
  not the best rank-k approximation of the posterior.

Every query uses ``Sigma = diag(1/d) - G G^T``: covariance-vector products, marginal variances
``1/d - rowsum(G^2)``, functional variance ``J D^-1 J^T - (J G)(J G)^T``; sampling uses the
symmetric square root (scalar: ``U`` eigenbasis; otherwise a thin QR of ``D^-1/2 W``).
Memory ``O(P k)``. ``log det`` is differentiable in ``c`` and the prior (marglik tuning).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from laplace_lab.io.fields import option
from laplace_lab.laplace.capture import Call
from laplace_lab.laplace.distributed import all_reduce_sum, fit_group
from laplace_lab.laplace.matrix_free.ggn_operator import OPERATOR_CURVATURE_TYPES, GGNOperator
from laplace_lab.laplace.matrix_free.lanczos import lanczos
from laplace_lab.laplace.modules import per_sample_grads
from laplace_lab.laplace.plan_terms import MemoryPlan, backend_batch_bytes, glm_bytes_per_input
from laplace_lab.laplace.priors import to_diag
from laplace_lab.laplace.structures.base import Structure, register


class LowRankPrecision(NamedTuple):
    """``P = U diag(eigvals) U^T + diag(prior_diag)`` (``eigvals`` already scaled by ``c``)."""

    U: torch.Tensor  # [P, k]
    eigvals: torch.Tensor  # [k]
    prior_diag: torch.Tensor  # [P]


def covariance_factors(U: torch.Tensor, eigvals: torch.Tensor, c, prior: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Woodbury factors of ``(c U diag(eigvals) U^T + diag(prior))^-1 = diag(dinv) - G G^T``:
    ``U`` ``[P, k]`` orthonormal, ``eigvals`` ``[k] > 0``, ``prior`` ``[1]`` (scalar) or ``[P]``.
    Returns ``(dinv [P], G [P, k])``."""
    P, k = U.shape
    if prior.numel() == 1:
        d = prior.reshape(())
        return (1.0 / d).expand(P), U * (1.0 / d - 1.0 / (c * eigvals + d)).sqrt()
    d = prior
    W = U * (c * eigvals).sqrt()
    B = W / d[:, None]  # D^-1 W
    L = torch.linalg.cholesky(torch.eye(k, device=U.device, dtype=U.dtype) + W.T @ B)
    G = torch.linalg.solve_triangular(L, B.T, upper=False).T  # B L^-T
    return 1.0 / d, G


@register
class LowRankStructure(Structure):
    """See the module docstring. ``n_eigs``: rank ``k``; ``n_steps``: Lanczos steps (default
    ``min(P, max(2k, k + 20))``); ``chunk_size`` / ``vec_chunk``: ``GGNOperator`` chunking;
    ``rtol``: relative eigenvalue cut-off; ``seed``: Lanczos start vector; ``block_size``: block
    Lanczos (vectors per batched GGN product; set the attribute after construction, e.g.
    ``la.structure.block_size = 10``, Laplace only forwards ``n_eigs``)."""

    name = "lowrank"
    label = "low-rank"
    prior_structures = ("scalar", "layerwise", "diagonal")
    curvature_types = tuple(OPERATOR_CURVATURE_TYPES)
    self_fitting = True
    shard_reduction = "operator"  # across processes: every Lanczos product summed over the ranks' shards

    @dataclass(frozen=True)
    class Options:
        """``n_eigs``: the rank ``k`` (top eigenpairs of the curvature; at most the number of parameters)."""

        n_eigs: int = option(100, "int", low=1)

    @property
    def H(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U [P, k], eigvals [k])``: ``H ~= U diag(eigvals) U^T``."""
        return self.U, self.eigvals

    def __init__(self, entries, device, dtype, n_eigs: int = Options.n_eigs, n_steps: int | None = None,
                 chunk_size: int | None = None, vec_chunk: int | None = None, rtol: float | None = None,
                 seed: int = 0, block_size: int = 1):
        n_eigs = self.check_options({"n_eigs": n_eigs}).n_eigs
        if n_steps is not None and not (isinstance(n_steps, int) and n_steps >= 1):
            raise ValueError(f"n_steps must be a positive int or None; got {n_steps!r}")
        self.n_eigs, self.n_steps, self.seed = n_eigs, n_steps, seed
        self.chunk_size, self.vec_chunk = chunk_size, vec_chunk
        self.rtol = rtol
        self.block_size = block_size
        self.op: GGNOperator | None = None
        super().__init__(entries, device, dtype)

    # ---- fitting ---------------------------------------------------------------------------
    def reset(self):
        self.U = torch.zeros(self.n_params, 0, device=self.device, dtype=self.dtype)
        self.eigvals = torch.zeros(0, device=self.device, dtype=self.dtype)

    def accumulate(self, records):
        raise ValueError("hessian_structure='lowrank' is fitted matrix-free by Laplace.fit(train_loader) "
                         "(Lanczos needs several data passes); fit_begin/fit_batch/fit_end are not supported")

    def fit(self, la, data: Iterable) -> tuple[torch.Tensor, int, int]:
        """Loss pass + Lanczos on the GGN of ``la``'s subset over ``data``; returns
        ``(loss, n_data, n_outputs)`` for the Laplace object."""
        if la.curvature not in OPERATOR_CURVATURE_TYPES:
            raise ValueError(f"curvature must be one of {OPERATOR_CURVATURE_TYPES} with hessian_structure="
                             f"'lowrank'; got {la.curvature!r}")
        self.op = GGNOperator(la.model, la.lik, data, params=la.params, curvature=la.curvature,
                              chunk_size=self.chunk_size, vec_chunk=self.vec_chunk)
        loss, n_data, n_outputs = self.op.loss()  # this rank's; Laplace.fit_end sums them across processes
        k = min(self.n_eigs, self.n_params)
        steps = None if self.n_steps is None else min(max(self.n_steps, k), self.n_params)
        gen = torch.Generator(device=self.device).manual_seed(self.seed)  # the same start on every rank
        matmat = self.op.matmat
        group = fit_group(la)
        if group is not None:  # shard_reduction "operator": H V = sum over the ranks' shards
            def matmat(V):
                return all_reduce_sum(self.op.matmat(V), group, "the sum of a lowrank Lanczos product")
        lam, U = lanczos(lambda v: matmat(v.reshape(-1, 1))[:, 0], self.n_params, k, steps, device=self.device,
                         dtype=self.dtype, generator=gen, block_size=min(self.block_size, steps or k),
                         matmat=matmat)
        self.set_eigenpairs(lam, U)
        return loss, n_data, n_outputs

    # ---- memory plan (laplace.plan) --------------------------------------------------------
    @classmethod
    def memory_plan(cls, shape, batch, n_factors, options):
        """``U`` ``[P, k]``; the fit holds the Lanczos basis ``[P, m]`` (``m = min(P, max(2k, k +
        20))`` steps) and one batch of the GGN operator (a forward, its Jacobian-vector product and
        the backward: about twice a batch backend's). Coarse: not checked by benchmarks/plan_accuracy.py."""
        b, P = shape.itemsize, shape.n_params
        k = min(cls.check_options(options).n_eigs, P)
        m = min(P, max(2 * k, k + 20))
        parts = {"Lanczos basis [P, m]": b * P * m, "eigenvectors [P, k]": b * P * k,
                 "GGN products": 2 * sum(backend_batch_bytes(shape, batch, n_factors, False).values())}
        return MemoryPlan(state=b * P * k, fit=sum(parts.values()), predict_fixed=2 * b * P * k,
                          predict_per_input=glm_bytes_per_input(shape), sample_fixed=b * P * k,
                          sample_per_draw=3 * b * P, parts=parts)

    def set_eigenpairs(self, eigvals: torch.Tensor, U: torch.Tensor) -> None:
        """Store ``H ~= U diag(eigvals) U^T``, dropping eigenvalues ``<= rtol * max``."""
        rtol = self.rtol if self.rtol is not None else 100 * torch.finfo(self.dtype).eps
        keep = eigvals > rtol * eigvals.max().clamp_min(0)
        self.eigvals = eigvals[keep].to(self.device, self.dtype)
        self.U = U[:, keep].to(self.device, self.dtype)

    # ---- posterior factors -----------------------------------------------------------------------
    def _prior(self, prior):
        return to_diag(prior, self.sizes)

    def covariance_factors_at(self, c, prior) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dinv [P], G [P, k])`` with ``Sigma = diag(dinv) - G G^T``."""
        return covariance_factors(self.U, self.eigvals, c, prior if prior.numel() == 1 else self._prior(prior))

    def precision(self, c, prior) -> LowRankPrecision:
        return LowRankPrecision(self.U, c * self.eigvals, self._prior(prior))

    def logdet(self, c, prior):
        if prior.numel() == 1:
            d = prior.reshape(())
            return (c * self.eigvals + d).log().sum() + (self.n_params - self.eigvals.numel()) * d.log()
        d = self._prior(prior)
        W = self.U * (c * self.eigvals).sqrt()
        M = torch.eye(self.U.shape[1], device=self.device, dtype=self.dtype) + W.T @ (W / d[:, None])
        return d.log().sum() + 2 * torch.linalg.cholesky(M).diagonal().log().sum()

    def covariance_matmul(self, V: torch.Tensor, c, prior) -> torch.Tensor:
        """``Sigma V`` for ``V`` ``[P, b]`` (Woodbury; never forms ``[P, P]``)."""
        dinv, G = self.covariance_factors_at(c, prior)
        return dinv[:, None] * V - G @ (G.T @ V)

    def covariance(self, c, prior) -> torch.Tensor:
        """``[P, P]`` dense covariance (small models / tests only)."""
        dinv, G = self.covariance_factors_at(c, prior)
        return torch.diag(dinv) - G @ G.T

    def posterior_variance(self, c, prior):
        dinv, G = self.covariance_factors_at(c, prior)
        return dinv - G.square().sum(1)

    def functional_variance(self, Js, c, prior):
        dinv, G = self.covariance_factors_at(c, prior)
        JG = Js @ G  # [N, C, k]
        return torch.einsum("ncp,nkp->nck", Js * dinv, Js) - JG @ JG.transpose(1, 2)

    def sample(self, n, c, prior, generator=None):
        eps = self.randn(self.n_params, n, generator=generator)
        if prior.numel() == 1:
            d = prior.reshape(())
            s = (c * self.eigvals + d).rsqrt() - d.rsqrt()
            return (eps * d.rsqrt() + self.U @ (s[:, None] * (self.U.T @ eps))).T
        d = self._prior(prior)
        Bt = self.U * ((c * self.eigvals).sqrt() / d.sqrt()[:, None])  # D^-1/2 W
        Q, R = torch.linalg.qr(Bt)
        S, Vr = torch.linalg.eigh(R @ R.T)
        Qv = Q @ Vr
        s = (1 + S.clamp_min(0)).rsqrt() - 1
        z = eps + Qv @ (s[:, None] * (Qv.T @ eps))  # (I + Bt Bt^T)^-1/2 eps
        return (z / d.sqrt()[:, None]).T

    def dense_precision(self, c, prior):
        return (self.U * (c * self.eigvals)) @ self.U.T + torch.diag(self._prior(prior))

    def square_norm(self, v, c, prior):
        """``v^T (c U diag(l) U^T + diag(prior)) v`` without ``[P, P]``."""
        return c * (self.eigvals * (self.U.T @ v).square()).sum() + (self._prior(prior) * v.square()).sum()

    def curvature_top_eigenvectors(self, k):
        top = self.eigvals.topk(min(k, self.eigvals.numel()))
        return top.values, self.U[:, top.indices]

    def state_dict(self):
        return {"U": self.U, "eigvals": self.eigvals}

    def load_state_dict(self, sd):
        self.U = sd["U"].to(self.device, self.dtype)
        self.eigvals = sd["eigvals"].to(self.device, self.dtype)

    def posterior_view(self, la) -> LowRankView:
        return LowRankView(la)


# --------------------------------------------------------------------------- predictive hooks
def _sub_call(c: Call, sl: slice) -> Call:
    """The inputs ``sl`` of one captured call, with their output gradients."""
    sub = Call(tuple(x[sl] if isinstance(x, torch.Tensor) else x for x in c.args), c.kwargs, c.output)
    sub.grad = c.grad[:, sl]
    return sub


class LowRankView:
    """Per-call view for ``functional_variance.functional_variance`` (the ``la(x)`` glm path):
    per sub-chunk, the Jacobian over the subset from the captured records
    (``modules.per_sample_grads``), then ``J D^-1 J^T - (J G)(J G)^T``."""

    def __init__(self, la):
        self.dinv, self.G = la.structure.covariance_factors_at(la.H_factor, la.structure_prior)

    def __call__(self, la, records, V, diag: bool, budget: int) -> torch.Tensor:
        K, N = next(c.grad for r in records for c in r.calls).shape[:2]
        P = self.dinv.shape[0]
        step = max(1, budget // max(1, K * P))
        parts = []
        for i in range(0, N, step):
            sl = slice(i, min(N, i + step))
            cols = []
            for e, r in zip(la.entries, records):
                if not r.calls:
                    cols += [p.new_zeros(sl.stop - sl.start, K, p.numel()) for p in e.params]
                    continue
                sub = [_sub_call(c, sl) for c in r.calls]
                psg = per_sample_grads(e.module, e.names, sub)
                cols += [psg[n].flatten(2).transpose(0, 1) for n in e.names]
            J = torch.cat(cols, -1)  # [n, K, P]
            JG = J @ self.G
            if diag:
                parts.append((J.square() * self.dinv).sum(-1) - JG.square().sum(-1))
            else:
                parts.append((J * self.dinv) @ J.transpose(1, 2) - JG @ JG.transpose(1, 2))
        return torch.cat(parts)


def functional_variance_jvp(op: GGNOperator, X: torch.Tensor, dinv: torch.Tensor, G: torch.Tensor,
                            prior_term: bool = True, chunk_size: int = 32,
                            col_chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Matrix-free ``J Sigma J^T`` at inputs ``X`` for ``Sigma = diag(dinv) - G G^T`` (the
    ``LowRankStructure._G`` form): ``(f [N, C], fvar [N, C, C])``. ``J G`` by ``jvp`` of the
    columns of ``G`` (``col_chunk`` columns per ``vmap``, ``chunk_size`` inputs per forward);
    ``J D^-1 J^T`` (``prior_term``) from per-input Jacobians of ``chunk_size`` inputs (memory
    ``chunk_size C P``). Without the prior term see ``functional_variance_lowrank``."""
    fs, out = [], []
    for i in range(0, X.shape[0], chunk_size):
        x = X[i:i + chunk_size]
        JG = []
        for j in range(0, G.shape[1], col_chunk):
            f, JGj = op.jvp(x, G[:, j:j + col_chunk].T)  # [b, n, C]
            JG.append(JGj)
        JG = torch.cat(JG).permute(1, 2, 0) if JG else None  # [n, C, k]
        if JG is None:
            with torch.no_grad():
                f = op.forward_fn(x)(op.primals())
        v = -(JG @ JG.transpose(1, 2)) if JG is not None else 0
        if prior_term:
            J = op.jacobian(x)
            v = v + (J * dinv) @ J.transpose(1, 2)
        fs.append(f)
        out.append(v)
    return torch.cat(fs), torch.cat(out)


def functional_variance_lowrank(op: GGNOperator, X: torch.Tensor, U: torch.Tensor, weights: torch.Tensor,
                                chunk_size: int = 32, col_chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f [N, C], (J U) diag(weights) (J U)^T [N, C, C])`` purely by jvps of the columns of ``U``
    (no Jacobian): the functional variance of ``Sigma = U diag(weights) U^T``, e.g. the exact
    posterior when ``U`` is complete (``weights = 1 / (c l + d)``), or the low-rank part only."""
    fs, out = [], []
    for i in range(0, X.shape[0], chunk_size):
        x = X[i:i + chunk_size]
        acc = 0
        for j in range(0, U.shape[1], col_chunk):
            f, JU = op.jvp(x, U[:, j:j + col_chunk].T)  # [b, n, C]
            w = weights[j:j + col_chunk]
            acc = acc + torch.einsum("bnc,b,bnk->nck", JU, w, JU)
        fs.append(f)
        out.append(acc)
    return torch.cat(fs), torch.cat(out)


__all__ = ["LowRankStructure", "LowRankPrecision", "LowRankView", "functional_variance_jvp",
           "functional_variance_lowrank"]
