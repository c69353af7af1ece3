"""Fully connected network: flatten -> [Linear -> (BatchNorm) -> activation] * depth -> Linear."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from laplace_lab.models.norm import check_norm, make_norm

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "silu": nn.SiLU, "elu": nn.ELU}


def make_activation(name: str) -> nn.Module:
    """Return a fresh activation module; ``name`` is one of ``ACTIVATIONS``."""
    if name not in ACTIVATIONS:
        raise ValueError(f"model.activation={name!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class MLP(nn.Sequential):
    """MLP on flattened inputs.

    Args:
        input_shape: shape of one input, e.g. ``(2,)`` or ``(1, 28, 28)``.
        num_outputs: width of the final linear layer (logits or regression outputs).
        widths: hidden layer widths, e.g. ``[50]``; empty gives a linear model.
        activation: one of ``relu``, ``tanh``, ``gelu``, ``silu``, ``elu``.
        norm: ``none`` (default) or ``batchnorm``: BatchNorm1d after every hidden Linear (which
            then has no bias, as in the CIFAR ResNets; each such Linear is a scale-invariant group).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_outputs: int,
        widths: Sequence[int] = (50,),
        activation: str = "relu",
        norm: str = "none",
    ):
        layers: list[nn.Module] = [nn.Flatten()]
        width_in = math.prod(input_shape)
        normed = check_norm(norm) != "none"
        for width in widths:
            layers.append(nn.Linear(width_in, int(width), bias=not normed))
            if normed:
                layers.append(make_norm(norm, int(width), dim=1))
            layers.append(make_activation(activation))
            width_in = int(width)
        layers.append(nn.Linear(width_in, num_outputs))
        super().__init__(*layers)
