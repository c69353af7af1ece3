"""WideResNet-d-k for 32x32 inputs (Zagoruyko & Komodakis 2016), pre-activation blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab.io.fields import option
from laplace_lab.models.base import LabModel
from laplace_lab.models.norm import NORMS, make_norm


class WideBlock(nn.Module):
    """Pre-activation block: norm -> relu -> conv3x3 -> norm -> relu -> conv3x3, plus shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str):
        super().__init__()
        self.bn1 = make_norm(norm, c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=norm == "none")
        self.bn2 = make_norm(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=norm == "none")
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=norm == "none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(torch.relu(self.bn1(x)))
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(LabModel, nn.Module):
    """WRN-depth-widen: (depth - 4) / 6 blocks per stage, stage widths 16k, 32k, 64k.

    Args:
        input_shape: ``(C, H, W)``.
        num_outputs: number of classes.
        *args, **options: ``Options`` (positional in its order, or by keyword): ``depth``,
            ``widen_factor``, ``norm``.
    """

    @dataclass(frozen=True)
    class Options:
        depth: int = option(16, "int", low=10)  # 6n + 4 (16 for WRN-16-4)
        widen_factor: int = option(4, "int", low=1)  # k (4 for WRN-16-4)
        norm: str = option("batchnorm", "str", choices=NORMS)  # or none: the variant without normalisation

    def __init__(self, input_shape: Sequence[int], num_outputs: int, *args, **options):
        o = self.bind_options(args, options)
        depth, widen_factor, norm = o.depth, o.widen_factor, o.norm
        super().__init__()
        self.options = o
        if (depth - 4) % 6 != 0:
            raise ValueError(f"model.depth must be 6n+4 (e.g. 10, 16, 22, 28); got {depth}")
        n = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.stem = nn.Conv2d(input_shape[0], 16, 3, 1, 1, bias=norm == "none")
        blocks, c_in = [], 16
        for stage, c_out in enumerate(widths):
            for i in range(n):
                blocks.append(WideBlock(c_in, c_out, 2 if (stage > 0 and i == 0) else 1, norm))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(make_norm(norm, c_in), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(c_in, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))))
