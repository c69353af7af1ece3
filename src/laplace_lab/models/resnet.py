"""CIFAR ResNet-18 (He et al. 2016; 3x3 stem, no max-pool, as in the CIFAR literature)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab.io.fields import option
from laplace_lab.models.base import LabModel
from laplace_lab.models.norm import NORMS, make_norm


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection; 1x1 projection when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=norm == "none")
        self.bn1 = make_norm(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=norm == "none")
        self.bn2 = make_norm(norm, c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=norm == "none"), make_norm(norm, c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(LabModel, nn.Module):
    """ResNet-18 for 32x32 inputs: stem, 4 stages of 2 blocks (widths w, 2w, 4w, 8w), GAP, linear.

    Args:
        input_shape: ``(C, H, W)``.
        num_outputs: number of classes.
        *args, **options: ``Options`` (positional in its order, or by keyword): ``width``, ``norm``.
    """

    @dataclass(frozen=True)
    class Options:
        width: int = option(64, "int", low=1)  # stem width (64 in the standard network; smaller for CPU smoke runs)
        norm: str = option("batchnorm", "str", choices=NORMS)

    def __init__(self, input_shape: Sequence[int], num_outputs: int, *args, **options):
        o = self.bind_options(args, options)
        width, norm = o.width, o.norm
        super().__init__()
        self.options = o
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], width, 3, 1, 1, bias=norm == "none"), make_norm(norm, width), nn.ReLU()
        )
        blocks, c_in = [], width
        for stage, c_out in enumerate([width, 2 * width, 4 * width, 8 * width]):
            for i in range(2):
                blocks.append(BasicBlock(c_in, c_out, 2 if (stage > 0 and i == 0) else 1, norm))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(c_in, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))))
