"""Batched (preconditioned) conjugate gradients for ``A X = B`` with a symmetric PD operator.

Hand-written (30 lines): torch has no CG, and ours solves all right-hand sides ``[n, s]`` at once
so every operator application is one batched (``vmap``-ed) GGN product; each column has its own
step sizes and stops on its own relative residual (converged columns are frozen).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class CGResult(NamedTuple):
    x: torch.Tensor  # [n, s] solutions
    n_iter: int  # iterations run (operator applications)
    rel_residual: torch.Tensor  # [s] ||B - A X|| / ||B|| (recursive residual)
    converged: bool


def cg(matmat: Callable[[torch.Tensor], torch.Tensor], B: torch.Tensor, *, x0: torch.Tensor | None = None,
       precond: Callable[[torch.Tensor], torch.Tensor] | None = None, tol: float = 1e-6,
       max_iter: int | None = None) -> CGResult:
    """Solve ``A X = B`` for ``B`` ``[n, s]`` given ``matmat(X [n, s]) -> A X``.

    ``precond(R [n, s])`` applies an approximate ``A^{-1}`` (SPD; e.g. ``jacobi(diag_A)`` or a
    low-rank Woodbury inverse); ``tol``: relative residual per column; ``max_iter`` default ``n``.
    """
    if B.ndim != 2:
        raise ValueError(f"B must be [n, s]; got shape {tuple(B.shape)}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    n = B.shape[0]
    max_iter = n if max_iter is None else max_iter
    M = precond if precond is not None else (lambda R: R)
    X = torch.zeros_like(B) if x0 is None else x0.clone()
    R = B - matmat(X) if x0 is not None else B.clone()
    bnorm = B.norm(dim=0).clamp_min(torch.finfo(B.dtype).tiny)
    Z = M(R)
    Pd = Z.clone()
    rz = (R * Z).sum(0)
    it = 0
    active = R.norm(dim=0) / bnorm > tol
    while it < max_iter and bool(active.any()):
        AP = matmat(Pd)
        pAp = (Pd * AP).sum(0)
        a = torch.where(active, rz / torch.where(active, pAp, torch.ones_like(pAp)), torch.zeros_like(rz))
        X = X + a * Pd
        R = R - a * AP
        it += 1
        active = active & (R.norm(dim=0) / bnorm > tol)
        Z = M(R)
        rz_new = (R * Z).sum(0)
        beta = torch.where(active, rz_new / torch.where(rz == 0, torch.ones_like(rz), rz), torch.zeros_like(rz))
        Pd = Z + beta * Pd
        rz = rz_new
    rel = R.norm(dim=0) / bnorm
    return CGResult(X, it, rel, bool((rel <= tol).all()))


def jacobi(diag: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Diagonal preconditioner ``R -> R / diag[:, None]`` (``diag`` ``[n]`` > 0)."""
    return lambda R: R / diag[:, None]


__all__ = ["cg", "CGResult", "jacobi"]
