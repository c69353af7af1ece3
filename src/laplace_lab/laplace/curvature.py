"""Output-space factors of the curvature types (hand-written: three lines each).

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

CURVATURES = ("ggn", "ef", "mc_fisher")


def output_factors(
    likelihood: Likelihood,
    curvature: str,
    f: torch.Tensor,
    y: torch.Tensor,
    n_mc_samples: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[K, N, C]`` output-space square-root factors of the curvature (see module doc)."""
    f = f.detach()
    if curvature == "ggn":
        return likelihood.hessian_sqrt(f)
    if curvature == "ef":
        return likelihood.grad(f, y)[None]
    if curvature == "mc_fisher":
        scale = 1.0 / math.sqrt(n_mc_samples)
        return torch.stack(
            [likelihood.grad(f, likelihood.sample(f, generator)) * scale for _ in range(n_mc_samples)]
        )
    raise ValueError(f"curvature must be one of {CURVATURES}; got {curvature!r}")
