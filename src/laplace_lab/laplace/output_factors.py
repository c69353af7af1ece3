"""Output-space factors of the curvature types (``CURVATURE_TYPES``: ggn | ef | mc_fisher, the
engine's ``curvature`` argument and the config's ``curvature.type``), hand-written: three lines each.

Every curvature of the log likelihood used here has the form ``sum_n J_n^T M_n J_n`` with
``J_n`` the network Jacobian of sample ``n`` and ``M_n = sum_k v_{nk} v_{nk}^T`` a PSD matrix in
output space. ``output_factors`` returns ``V`` of shape ``[K, N, C]`` holding the ``v_{nk}``:

- ``ggn``: ``M_n`` = exact Hessian of the NLL w.r.t. the output (``K = C``).
- ``ef``: ``v_n`` = gradient of the NLL at the observed target (``K = 1``).
- ``mc_fisher``: ``v_{nk}`` = gradient at target ``k`` sampled from the model, divided by
  ``sqrt(n_mc_samples)`` (``K = n_mc_samples``); unbiased for ``ggn``.

Backpropagating ``V`` through the network gives per-module output gradients; the structures turn
those into full / diagonal / Kronecker curvature.
"""

from __future__ import annotations

import math

import torch

from laplace_lab.laplace.likelihoods import Likelihood
from laplace_lab.laplace.options import CurvatureType

CURVATURE_TYPES = CurvatureType.values()


def _classification_ggn_sqrt(f: torch.Tensor) -> torch.Tensor:
    """``[C - 1, N, C]`` exact square root of ``diag(p) - p p^T`` (rank ``C - 1``).

    The ``C`` columns ``v_k = sqrt(p_k) (e_k - p)`` satisfy ``sum_k sqrt(p_k) v_k = 0``: with the
    unit vector ``u = sqrt(p)`` and a Householder reflection ``Q`` that maps ``e_j`` to ``-u``
    (``j = argmax p``, so ``|w|^2 = 2 + 2 u_j >= 2``: no cancellation), ``V Q`` has a zero column
    ``j`` and ``(V Q)(V Q)^T = V V^T``. Dropping it saves one of the ``C`` backward passes (and a
    tenth of the factor work) of the exact GGN.
    """
    p = f.softmax(-1)  # [N, C]
    N, C = p.shape
    eye = torch.eye(C, dtype=p.dtype, device=p.device)
    V = p.sqrt()[:, None, :] * (eye[None] - p[:, :, None])  # [N, C(out), C(factor)]
    u = p.sqrt()
    j = p.argmax(-1)
    w = u + eye[j]  # [N, C]
    Vw = torch.einsum("noc,nc->no", V, w)
    VQ = V - (2.0 / (w * w).sum(-1))[:, None, None] * Vw[:, :, None] * w[:, None, :]
    keep = torch.arange(C, device=p.device)[None].expand(N, C)
    keep = keep[keep != j[:, None]].reshape(N, C - 1)
    VQ = torch.gather(VQ, 2, keep[:, None, :].expand(N, C, C - 1))  # [N, C, C - 1]
    return VQ.permute(2, 0, 1)


def output_factors(
    likelihood: Likelihood,
    curvature_type: str,
    f: torch.Tensor,
    y: torch.Tensor,
    n_mc_samples: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[K, N, C]`` output-space square-root factors of the curvature of type ``curvature_type`` (see module doc)."""
    f = f.detach()
    if curvature_type == "ggn":
        if likelihood.name == "classification" and f.shape[1] > 1:
            return _classification_ggn_sqrt(f)
        return likelihood.hessian_sqrt(f)
    if curvature_type == "ef":
        return likelihood.grad(f, y)[None]
    if curvature_type == "mc_fisher":
        scale = 1.0 / math.sqrt(n_mc_samples)
        return torch.stack(
            [likelihood.grad(f, likelihood.sample(f, generator)) * scale for _ in range(n_mc_samples)]
        )
    raise ValueError(f"curvature must be one of {CURVATURE_TYPES}; got {curvature_type!r}")


def n_output_factors(likelihood: str, curvature_type: str, n_outputs: int, n_mc_samples: int = 1) -> int:
    """``K``, the number of factors ``output_factors`` returns (the exact classification GGN drops
    one of the ``C``: ``_classification_ggn_sqrt``)."""
    if curvature_type == "ggn":
        return n_outputs - 1 if likelihood == "classification" and n_outputs > 1 else n_outputs
    if curvature_type == "ef":
        return 1
    if curvature_type == "mc_fisher":
        return n_mc_samples
    raise ValueError(f"curvature must be one of {CURVATURE_TYPES}; got {curvature_type!r}")
