"""LeNet-5 as used by Laplace Redux and Immer et al. 2021 (ReLU, max pooling)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from laplace_lab.models.mlp import make_activation


class LeNet(nn.Sequential):
    """conv(6,5) -> act -> pool2 -> conv(16,5) -> act -> pool2 -> fc120 -> act -> fc84 -> act -> fc.

    Args:
        input_shape: ``(channels, height, width)``, e.g. ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_outputs: number of classes.
        activation: hidden activation name (see ``laplace_lab.models.mlp.ACTIVATIONS``).
    """

    def __init__(self, input_shape: Sequence[int], num_outputs: int, activation: str = "relu"):
        if len(input_shape) != 3:
            raise ValueError(f"LeNet needs image inputs (C, H, W); got input_shape={tuple(input_shape)}")
        features = nn.Sequential(
            nn.Conv2d(input_shape[0], 6, 5),
            make_activation(activation),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            make_activation(activation),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = features(torch.zeros(1, *input_shape)).shape[1]
        super().__init__(
            *features,
            nn.Linear(n_flat, 120),
            make_activation(activation),
            nn.Linear(120, 84),
            make_activation(activation),
            nn.Linear(84, num_outputs),
        )
