"""Negative log likelihoods used by the training loss, summed over the batch.

The likelihoods themselves are the Laplace engine's (``laplace_lab.laplace.likelihoods``), so
training and the Laplace approximation share one definition: classification is softmax
cross-entropy; heteroscedastic regression uses the Gaussian's natural parameters, the network
emitting ``[eta1, raw]`` per target with ``eta2 = -softplus(raw)``. The engine's regression NLL is
the unit-noise ``0.5 sum (f - y)^2``; the training loss adds the noise std ``sigma`` and the
Gaussian normaliser, because online marglik changes sigma during training.
"""

from __future__ import annotations

import math

import torch

from laplace_lab.laplace.likelihoods import HeteroscedasticRegression, get_likelihood
from laplace_lab.laplace.options import Likelihood

LIKELIHOODS = Likelihood.values()

# ``f [B, 2*O]`` = ``[eta1 (O), raw (O)]`` -> mean ``[B, O]``, variance ``[B, O]``.
natural_to_mean_var = HeteroscedasticRegression.mean_var


def summed_nll(f: torch.Tensor, y: torch.Tensor, likelihood: str, sigma_noise: torch.Tensor | float = 1.0) -> torch.Tensor:
    """``-sum_n log p(y_n | f_n)`` as a 0-dim tensor.

    Shapes: classification ``f [B, C]``, ``y [B]``; regression ``f, y [B, O]``;
    heteroscedastic ``f [B, 2*O]``, ``y [B, O]``.
    """
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood={likelihood!r} is not supported; allowed: {list(LIKELIHOODS)}")
    lik = get_likelihood(likelihood)
    f, y = lik.prepare(f, y)
    if likelihood != "regression":
        return lik.nll(f, y)
    sigma2 = torch.as_tensor(sigma_noise, dtype=f.dtype, device=f.device) ** 2
    return lik.nll(f, y) / sigma2 + 0.5 * f.numel() * torch.log(2 * math.pi * sigma2)
