"""Negative log likelihoods used by the training loss, summed over the batch.

Conventions (the same as the Laplace engine): classification is softmax cross-entropy;
regression is Gaussian with scalar noise std ``sigma`` over all outputs; heteroscedastic
regression uses the natural parameters of the Gaussian, the network emitting
``[eta1, raw]`` per target with ``eta2 = -softplus(raw)`` (so eta2 < 0).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

LIKELIHOODS = ("classification", "regression", "heteroscedastic_regression")


def natural_to_mean_var(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``f [B, 2*O]`` = ``[eta1 (O), raw (O)]`` -> mean ``[B, O]``, variance ``[B, O]``."""
    eta1, raw = f.chunk(2, dim=-1)
    eta2 = -F.softplus(raw)
    return -eta1 / (2 * eta2), -1 / (2 * eta2)


def summed_nll(f: torch.Tensor, y: torch.Tensor, likelihood: str, sigma_noise: torch.Tensor | float = 1.0) -> torch.Tensor:
    """``-sum_n log p(y_n | f_n)`` as a 0-dim tensor.

    Shapes: classification ``f [B, C]``, ``y [B]``; regression ``f, y [B, O]``;
    heteroscedastic ``f [B, 2*O]``, ``y [B, O]``.
    """
    if likelihood == "classification":
        return F.cross_entropy(f, y, reduction="sum")
    if likelihood == "regression":
        sigma2 = torch.as_tensor(sigma_noise, dtype=f.dtype, device=f.device) ** 2
        y = y.reshape(f.shape)
        return 0.5 * ((f - y) ** 2).sum() / sigma2 + 0.5 * f.numel() * torch.log(2 * math.pi * sigma2)
    if likelihood == "heteroscedastic_regression":
        eta1, raw = f.chunk(2, dim=-1)
        eta2 = -F.softplus(raw)
        y = y.reshape(eta1.shape)
        log_lik = eta1 * y + eta2 * y**2 + eta1**2 / (4 * eta2) + 0.5 * torch.log(-2 * eta2) - 0.5 * math.log(2 * math.pi)
        return -log_lik.sum()
    raise ValueError(f"likelihood={likelihood!r} is not supported; allowed: {list(LIKELIHOODS)}")
