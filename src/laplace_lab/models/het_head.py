"""Output heads of a heteroscedastic (natural-parameter) regression network.

The engine's likelihood (``laplace.likelihoods.HeteroscedasticRegression``) reads the network's
``[eta1 (D) | raw (D)]`` as ``eta2 = -softplus(raw)`` (noise precision ``2 softplus(raw)``). The
heteroscedastic-nn authors' ``NaturalHead`` (``hetreg/models.py``) uses ``eta2 = -0.5 (softplus(r) +
1e-8)`` (noise precision ``softplus(r) + 1e-8``) of the network's last output ``r``. ``HalfSoftplusHead``
appended to a network maps its ``r`` to the ``raw`` with ``softplus(raw) = 0.5 (softplus(r) + 1e-8)``,
so the engine's likelihood then gives the authors' ``eta2`` exactly; the head has no parameters and the
network Jacobian (GGN, predictive) includes it, as the authors' Laplace includes their head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HET_HEADS = ("softplus", "half_softplus")
EPS = 1e-8  # the authors' stable_softplus offset


def softplus_inverse(y: torch.Tensor) -> torch.Tensor:
    """``x`` with ``softplus(x) = y`` for ``y > 0`` (``y + log(1 - exp(-y))``, stable for small y)."""
    return y + torch.log(-torch.expm1(-y))


class HalfSoftplusHead(nn.Module):
    """``[eta1 | r] -> [eta1 | softplus^-1(0.5 (softplus(r) + 1e-8))]`` on ``[B, 2D]`` outputs."""

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        D = f.shape[-1] // 2
        eta1, r = f[..., :D], f[..., D:]
        return torch.cat([eta1, softplus_inverse(0.5 * (F.softplus(r) + EPS))], -1)


def with_het_head(model: nn.Module, head: str) -> nn.Module:
    """``model`` with the heteroscedastic output head ``head`` (``HET_HEADS``): ``softplus`` is the
    engine's own link (the model unchanged), ``half_softplus`` the authors' (``HalfSoftplusHead``)."""
    if head not in HET_HEADS:
        raise ValueError(f"het_head={head!r} is not supported; allowed: {list(HET_HEADS)}")
    return model if head == "softplus" else nn.Sequential(model, HalfSoftplusHead())
