"""LeNet-5 as used by Laplace Redux and Immer et al. 2021 (ReLU, max pooling); optional BatchNorm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab.io.fields import option
from laplace_lab.models.base import LabModel
from laplace_lab.models.mlp import ACTIVATIONS, make_activation
from laplace_lab.models.norm import NORMS, make_norm


class LeNet(LabModel, nn.Sequential):
    """conv(6,5) -> act -> pool2 -> conv(16,5) -> act -> pool2 -> fc120 -> act -> fc84 -> act -> fc.

    Args:
        input_shape: ``(channels, height, width)``, e.g. ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_outputs: number of classes.
        *args, **options: ``Options`` (positional in its order, or by keyword): ``activation``, ``norm``.
    """

    @dataclass(frozen=True)
    class Options:
        activation: str = option("relu", "str", choices=tuple(sorted(ACTIVATIONS)))  # hidden activation
        # none: the network above | batchnorm: BatchNorm after every conv and hidden fc, before the
        # activation (those layers then have no bias)
        norm: str = option("none", "str", choices=NORMS)

    def __init__(self, input_shape: Sequence[int], num_outputs: int, *args, **options):
        o = self.bind_options(args, options)
        activation, norm = o.activation, o.norm
        if len(input_shape) != 3:
            raise ValueError(f"LeNet needs image inputs (C, H, W); got input_shape={tuple(input_shape)}")
        bias = norm == "none"

        def block(layer: nn.Module, width: int, dim: int) -> list[nn.Module]:
            return [layer, *([make_norm(norm, width, dim)] if not bias else []), make_activation(activation)]

        features = nn.Sequential(
            *block(nn.Conv2d(input_shape[0], 6, 5, bias=bias), 6, 2),
            nn.MaxPool2d(2),
            *block(nn.Conv2d(6, 16, 5, bias=bias), 16, 2),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():  # eval: the probe must not touch BatchNorm running statistics
            n_flat = features.eval()(torch.zeros(1, *input_shape)).shape[1]
        features.train()
        super().__init__(
            *features,
            *block(nn.Linear(n_flat, 120, bias=bias), 120, 1),
            *block(nn.Linear(120, 84, bias=bias), 84, 1),
            nn.Linear(84, num_outputs),
        )
        self.options = o
