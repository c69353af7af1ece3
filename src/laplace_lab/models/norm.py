"""Normalisation layer factory shared by the networks (``model.norm``)."""

from __future__ import annotations

from torch import nn

NORMS = ("batchnorm", "none")


def check_norm(norm: str) -> str:
    """``norm`` if it is one of ``NORMS``; otherwise a ``ValueError`` naming the allowed values."""
    if norm not in NORMS:
        raise ValueError(f"model.norm={norm!r} is not supported; allowed: {list(NORMS)}")
    return norm


def make_norm(norm: str, channels: int, dim: int = 2) -> nn.Module:
    """BatchNorm over ``channels`` for ``norm="batchnorm"`` (``dim=2``: BatchNorm2d for images
    ``[B, C, H, W]``; ``dim=1``: BatchNorm1d for features ``[B, C]``), identity for ``norm="none"``."""
    if check_norm(norm) == "batchnorm":
        return nn.BatchNorm2d(channels) if dim == 2 else nn.BatchNorm1d(channels)
    return nn.Identity()
