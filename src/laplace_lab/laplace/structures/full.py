"""Full curvature ``H`` ``[P, P]``.

Accumulation: ``H += V^T V`` with ``V`` ``[K N, P]`` the per-sample, per-factor gradients over the
subset (from ``modules.per_sample_grads``; the full matrix is P x P anyway). A single Linear
layer with 2-d input (the last-layer case) uses ``sum_n M_n (x) a_n a_n^T`` with
``M_n = sum_k g_nk g_nk^T`` instead, so ``phi (x) I`` is never formed.
Queries use a Cholesky factor of ``c H + diag(prior)`` computed per call (differentiable).
``H`` is accumulated and factorised in float64 whatever the model's dtype: a float32 ``V^T V`` is
PSD only up to rounding of order 1e-7 ||H||, which a large ``c`` (small noise: 1/sigma^2) turns
into negative eigenvalues larger than a small prior precision, and Cholesky fails. Results are
returned in the model's dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from laplace_lab.laplace.modules import _k_chunks, per_sample_grads, rows_in
from laplace_lab.laplace.plan_terms import MemoryPlan, backend_batch_bytes, glm_bytes_per_input
from laplace_lab.laplace.priors import to_diag
from laplace_lab.laplace.structures.base import Structure, register


def _linear_full_block(m: nn.Linear, names, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """GGN block of one Linear layer without Jacobians; ``a`` [N, d], ``g`` [K, N, C]."""
    N, d = a.shape
    C = g.shape[-1]
    M = torch.einsum("kno,knq->noq", g, g)  # [N, C, C]
    blocks = {}
    if "weight" in names:
        WW = a.new_zeros(C * C, d * d)
        step = max(1, 2**24 // max(1, d * d))
        for i in range(0, N, step):
            aa = (a[i:i + step, :, None] * a[i:i + step, None, :]).reshape(-1, d * d)
            WW += M[i:i + step].reshape(-1, C * C).T @ aa
        blocks["WW"] = WW.reshape(C, C, d, d).permute(0, 2, 1, 3).reshape(C * d, C * d)
    if "bias" in names:
        blocks["bb"] = M.sum(0)
    if len(names) == 2:
        blocks["Wb"] = torch.einsum("noq,ni->oiq", M, a).reshape(C * d, C)
        return torch.cat(
            [torch.cat([blocks["WW"], blocks["Wb"]], 1), torch.cat([blocks["Wb"].T, blocks["bb"]], 1)], 0
        )
    return blocks["WW"] if "weight" in names else blocks["bb"]


@register
class FullStructure(Structure):
    name = "full"
    label = "full"
    dense_cholesky = True
    shard_reduction = "sum"

    def reset(self):
        self._H = None  # allocated on the first accumulate: constructing a Laplace costs no memory

    def _H_acc(self) -> torch.Tensor:
        if self._H is None:
            self._H = torch.zeros(self.n_params, self.n_params, device=self.device, dtype=torch.float64)
        return self._H

    def finalize(self):
        self._H_acc()  # an empty data pass leaves H = 0

    def shard_sums(self):
        return {"H": self._H_acc()}  # float64, summed in float64

    @property
    def H(self) -> torch.Tensor | None:
        """``[P, P]`` curvature in the model's dtype (accumulated in float64); ``None`` before fitting."""
        return None if self._H is None else self._H.to(self.dtype)

    def accumulate(self, records):
        if len(self.entries) == 1 and isinstance(self.entries[0].module, nn.Linear):
            calls = records[0].calls
            if len(calls) == 1 and calls[0].args[0].ndim == 2:
                a = rows_in(self.entries[0].module, calls[0].args[0])[:, 0]
                self._H_acc().add_(_linear_full_block(self.entries[0].module, self.entries[0].names, a.double(),
                                              calls[0].grad.double()))
                return
        K, N = next(c.grad for r in records for c in r.calls).shape[:2]
        for ks in _k_chunks(K, N, self.n_params):
            cols = []
            for e, r in zip(self.entries, records):
                if not r.calls:
                    cols += [p.new_zeros(len(range(K)[ks]) * N, p.numel()) for p in e.params]
                    continue
                psg = per_sample_grads(e.module, e.names, r.calls, ks)
                cols += [psg[n].reshape(-1, getattr(e.module, n).numel()) for n in e.names]
            V = torch.cat(cols, 1).double()
            self._H_acc().add_(V.T @ V)

    # ---- memory plan (laplace.plan) --------------------------------------------------------
    @classmethod
    def memory_plan(cls, shape, batch, n_factors, options):
        """``H`` ``[P, P]`` in float64. Fit: ``H`` plus ``V^T V``'s ``[P, P]`` float64 result and the
        per-sample gradients ``V`` of ``k N`` rows (``modules._k_chunks``: float32 columns, their
        concatenation and its float64 copy); a single Linear (last layer) instead builds its block
        from ``[C^2, d^2]`` float64 sums, their permuted copy and, with a bias, the assembled block
        (about ``4 P^2`` float64 in all). Predictive / sampling: the precision and its Cholesky
        factor or inverse, two more ``[P, P]`` float64."""
        b, P, N, K = shape.itemsize, shape.n_params, batch, n_factors
        dense = 8 * P * P
        parts = backend_batch_bytes(shape, batch, n_factors, cls.factor_chunks)
        lay = shape.layers[0]
        if len(shape.layers) == 1 and lay.kfac and lay.positions == 1 and lay.d_in:  # _linear_full_block
            C, d = lay.d_out, lay.d_in
            ww = 8 * C * C * d * d
            bias = lay.numel > C * d
            parts |= {"H [P, P] float64": dense, "weight block sums": ww,
                      "weight block copy": ww, "assembled block": dense if bias else 0,
                      "per-input sums": 8 * N * (C * C + d + K * C) + 8 * min(N, max(1, 2 ** 24 // (d * d))) * d * d}
        else:
            rows = max(1, min(K, 2 ** 25 // max(1, N * P))) * N  # modules._k_chunks
            parts |= {"H [P, P] float64": dense, "V^T V float64": dense,
                      "per-sample gradients": (2 * b + 8) * rows * P}
        return MemoryPlan(state=dense, fit=sum(parts.values()), predict_fixed=2 * dense + b * P * P,
                          predict_per_input=glm_bytes_per_input(shape) + b * K * P, sample_fixed=2 * dense,
                          sample_per_draw=3 * 8 * P, parts=parts)

    def curvature_eigh(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lam [P], U [P, P])``: float64 eigendecomposition ``H = U diag(lam) U^T``."""
        return torch.linalg.eigh(self._H_acc())

    def curvature_top_eigenvectors(self, k):
        lam, U = self.curvature_eigh()  # ascending
        k = min(k, self.n_params)
        return lam[-k:].flip(0).to(self.dtype), U[:, -k:].flip(1).to(self.dtype)

    def _precision64(self, c, prior):
        """``c H + diag(prior)`` in float64 (the prior added in place on the diagonal: no ``[P, P]``
        diagonal matrix is built; the same values as ``c H + torch.diag(prior)``)."""
        P = torch.as_tensor(c).double() * self._H
        P.diagonal().add_(to_diag(prior, self.sizes).double())
        return P

    def precision(self, c, prior):
        """``[P, P]`` posterior precision (model dtype)."""
        return self._precision64(c, prior).to(self.dtype)

    def cholesky(self, c, prior):
        """Lower Cholesky factor ``L`` (float64) of the posterior precision (``P = L L^T``)."""
        return torch.linalg.cholesky(self._precision64(c, prior))

    def covariance(self, c, prior):
        return torch.cholesky_inverse(self.cholesky(c, prior)).to(self.dtype)

    def logdet(self, c, prior):
        return (2 * self.cholesky(c, prior).diagonal().log().sum()).to(self.dtype)

    def sample(self, n, c, prior, generator=None):
        L = self.cholesky(c, prior)
        z = self.randn(self.n_params, n, generator=generator).double()
        return torch.linalg.solve_triangular(L.T, z, upper=True).T.to(self.dtype)

    def functional_variance(self, Js, c, prior):
        return torch.einsum("ncp,pq,nkq->nck", Js, self.covariance(c, prior), Js)

    def posterior_variance(self, c, prior):
        return self.covariance(c, prior).diagonal()

    def preconditioner(self, c, prior):
        """The dense covariance (the exact inverse)."""
        S = self.covariance(c, prior).detach()
        return lambda R: S @ R

    def posterior_view(self, la):
        from laplace_lab.laplace.functional_variance import FullView

        return FullView(la)

    def dense_precision(self, c, prior):
        return self.precision(c, prior)

    def state_dict(self):
        return {"H": self._H}

    def load_state_dict(self, sd):
        self._H = sd["H"].to(self.device, torch.float64)
