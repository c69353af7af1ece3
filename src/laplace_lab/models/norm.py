"""Normalisation layer factory shared by the CIFAR networks."""

from __future__ import annotations

from torch import nn

NORMS = ("batchnorm", "none")


def make_norm(norm: str, channels: int) -> nn.Module:
    """BatchNorm2d for ``norm="batchnorm"``, identity for ``norm="none"`` (the Fixup-free variant)."""
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"model.norm={norm!r} is not supported; allowed: {list(NORMS)}")
