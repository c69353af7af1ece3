"""LeNet-5 as used by Laplace Redux and Immer et al. 2021 (ReLU, max pooling); optional BatchNorm."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from laplace_lab.models.mlp import make_activation
from laplace_lab.models.norm import check_norm, make_norm


class LeNet(nn.Sequential):
    """conv(6,5) -> act -> pool2 -> conv(16,5) -> act -> pool2 -> fc120 -> act -> fc84 -> act -> fc.

    Args:
        input_shape: ``(channels, height, width)``, e.g. ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_outputs: number of classes.
        activation: hidden activation name (see ``laplace_lab.models.mlp.ACTIVATIONS``).
        norm: ``none`` (default: the network above) or ``batchnorm``: BatchNorm after every conv
            and hidden fc, before the activation (those layers then have no bias).
    """

    def __init__(self, input_shape: Sequence[int], num_outputs: int, activation: str = "relu",
                 norm: str = "none"):
        if len(input_shape) != 3:
            raise ValueError(f"LeNet needs image inputs (C, H, W); got input_shape={tuple(input_shape)}")
        bias = check_norm(norm) == "none"

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
