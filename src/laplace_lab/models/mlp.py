"""Fully connected network: flatten -> [Linear -> (BatchNorm) -> activation] * depth -> Linear."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from laplace_lab.io.fields import option
from laplace_lab.models.base import LabModel
from laplace_lab.models.norm import NORMS, make_norm

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "silu": nn.SiLU, "elu": nn.ELU}


def make_activation(name: str) -> nn.Module:
    """Return a fresh activation module; ``name`` is one of ``ACTIVATIONS``."""
    if name not in ACTIVATIONS:
        raise ValueError(f"model.activation={name!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class MLP(LabModel, nn.Sequential):
    """MLP on flattened inputs.

    Args:
        input_shape: shape of one input, e.g. ``(2,)`` or ``(1, 28, 28)``.
        num_outputs: width of the final linear layer (logits or regression outputs).
        *args, **options: ``Options`` (positional in its order, or by keyword): ``widths``,
            ``activation``, ``norm``.
    """

    @dataclass(frozen=True)
    class Options:
        widths: list = option([50], "list", items="int", low=1, indexed=True)  # hidden layer widths; [] a linear model
        activation: str = option("relu", "str", choices=tuple(sorted(ACTIVATIONS)))
        # none | batchnorm: BatchNorm1d after every hidden Linear (which then has no bias, as in the
        # CIFAR ResNets; each such Linear is a scale-invariant group)
        norm: str = option("none", "str", choices=NORMS)

    def __init__(self, input_shape: Sequence[int], num_outputs: int, *args, **options):
        o = self.bind_options(args, options)
        layers: list[nn.Module] = [nn.Flatten()]
        width_in = math.prod(input_shape)
        normed = o.norm != "none"
        for width in o.widths:
            layers.append(nn.Linear(width_in, int(width), bias=not normed))
            if normed:
                layers.append(make_norm(o.norm, int(width), dim=1))
            layers.append(make_activation(o.activation))
            width_in = int(width)
        layers.append(nn.Linear(width_in, num_outputs))
        super().__init__(*layers)
        self.options = o
