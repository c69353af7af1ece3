"""(Block) Lanczos with full reorthogonalisation for the top-k eigenpairs of a symmetric PSD
operator.

Hand-written (about 60 lines, torch-native and device-agnostic; scipy's ``eigsh`` is CPU/numpy
only and works one vector at a time). ``m`` steps build an orthonormal Krylov basis ``Q``
``[n, m]`` in blocks of ``block_size`` vectors (``block_size=1``: classic Lanczos); each new
block is orthogonalised twice against all previous vectors ("twice is enough") and the
projection coefficients of both passes fill ``T = Q^T A Q`` (block tridiagonal up to round-off;
symmetrised). The Ritz pairs ``(theta, Q s)`` of ``T`` approximate the extreme eigenpairs. A
(partial) breakdown, i.e. an invariant subspace such as the null space of a rank-deficient GGN,
continues with random vectors orthogonal to ``Q``, so ``m = n`` steps give the exact
eigendecomposition. Blocks turn ``block_size`` matrix-vector products into one batched product
(one data pass, ``vmap``-ed jvp/vjp), several times cheaper per vector on a network; for the
same ``m`` the Krylov polynomial degree is ``m / block_size``, so use more steps for accurate
trailing pairs. Memory: ``n x m`` for the basis. Cost: ``m / block_size`` operator calls plus
``O(n m^2)`` reorthogonalisation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _orth_against(W: torch.Tensor, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Project the columns of ``W`` off span(``Q``) twice; returns ``(W', coefficients)``."""
    C = torch.zeros(Q.shape[1], W.shape[1], device=W.device, dtype=W.dtype)
    for _ in range(2):
        c = Q.T @ W
        W = W - Q @ c
        C = C + c
    return W, C


def lanczos(matvec: Callable[[torch.Tensor], torch.Tensor], n: int, k: int, n_steps: int | None = None,
            *, device=None, dtype=torch.float32, generator: torch.Generator | None = None,
            v0: torch.Tensor | None = None, block_size: int = 1,
            matmat: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` eigenpairs of a symmetric operator ``A`` ``[n, n]``.

    Args:
        matvec: ``v [n] -> A v`` (used when ``block_size == 1`` and ``matmat`` is None).
        matmat: ``V [n, b] -> A V`` (default: ``matvec`` column by column).
        n_steps: basis size ``m`` (default ``min(n, max(2 k, k + 20))``; ``m = n`` is exact).
        v0: start vector ``[n]`` or block ``[n, b]`` (default: standard normal from ``generator``).
        block_size: vectors per operator call.

    Returns ``(eigvals [k] descending, eigvecs [n, k])`` (orthonormal columns).
    """
    if not (isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"k must be an int in [1, n={n}]; got {k!r}")
    m = min(n, max(2 * k, k + 20)) if n_steps is None else n_steps
    if not (isinstance(m, int) and k <= m <= n):
        raise ValueError(f"n_steps must be an int in [k={k}, n={n}]; got {n_steps!r}")
    if not (isinstance(block_size, int) and 1 <= block_size <= m):
        raise ValueError(f"block_size must be an int in [1, n_steps={m}]; got {block_size!r}")
    if matmat is None:
        def matmat(V):
            return torch.stack([matvec(v) for v in V.T], 1)

    def rand(b):
        return torch.randn(n, b, generator=generator, device=device, dtype=dtype)

    Q = torch.zeros(n, m, device=device, dtype=dtype)
    T = torch.zeros(m, m, dtype=torch.float64)
    b = block_size
    V = (v0.to(device=device, dtype=dtype).reshape(n, -1) if v0 is not None else rand(b))[:, :b]
    V = torch.linalg.qr(V)[0]
    eps = torch.finfo(dtype).eps
    anorm, j = 0.0, 0
    while j < m:
        b = min(V.shape[1], m - j)
        Q[:, j:j + b] = V[:, :b]
        W = matmat(Q[:, j:j + b]).to(dtype)
        W, C = _orth_against(W, Q[:, :j + b])
        T[:j + b, j:j + b] = C.double().cpu()
        anorm = max(anorm, float(C[j:j + b].abs().max()))
        j += b
        if j >= m:
            break
        # rank-revealing orthonormalisation W = V R with R = diag(s) Vh (SVD). A direction with
        # s ~ 0 (breakdown: an invariant subspace) or one that is not orthogonal to Q to working
        # precision (s tiny relative to ||W||) carries no coupling: it is replaced by a random
        # vector orthogonal to Q and its row of R is zeroed. The others are re-orthogonalised.
        V, sv, Vh = torch.linalg.svd(W, full_matrices=False)
        R = sv[:, None] * Vh
        bad = sv <= 10 * eps * max(anorm, 1e-30) * n ** 0.5
        V = V.clone()
        for i in range(min(V.shape[1], m - j)):
            for _ in range(3):
                v = rand(1) if bool(bad[i]) else V[:, i:i + 1]
                v, _ = _orth_against(v, torch.cat([Q[:, :j], V[:, :i]], 1))
                nv = v.norm()
                if nv > 0.5:
                    break
                bad[i] = True  # lost to round-off: treat as a breakdown direction
            V[:, i] = (v / nv)[:, 0]
        R[bad] = 0.0
        bnext = min(b, m - j)
        T[j:j + bnext, j - b:j] = R[:bnext].double().cpu()
    T = torch.tril(T) + torch.tril(T, -1).T  # symmetric: lower part (incl. the R blocks) mirrored
    theta, S = torch.linalg.eigh(T)
    idx = torch.argsort(theta, descending=True)[:k]
    vecs = Q @ S[:, idx].to(device=device, dtype=dtype)
    return theta[idx].to(device=device, dtype=dtype), vecs


__all__ = ["lanczos"]
