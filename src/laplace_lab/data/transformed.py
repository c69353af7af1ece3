"""Fixed-seed transformed image sets (the MNIST variants of Immer, van der Ouderaa et al. 2022).

``transform_images(X, kind, train)``: every image ``[N, C, H, W]`` (values in [0, 1]) gets one
random affine transformation, drawn once from a fixed seed (1 for the training split, 0 for the
test split, as in the authors' datasets), bilinear resampling, zero padding, clamped to [0, 1]:

- ``rotated_full``: rotation ``U(-180, 180)`` degrees (the authors' ``mnist_r180``);
- ``rotated_partial``: rotation ``U(-90, 90)`` degrees (``mnist_r90``);
- ``translated``: shift ``U(-8, 8)`` pixels in x and y independently (``translated_mnist``, 28 px images).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TRANSFORMS = ("none", "rotated_full", "rotated_partial", "translated")


def check_transform(kind: str) -> str:
    if kind not in TRANSFORMS:
        raise ValueError(f"data.transform={kind!r} is not supported; allowed: {list(TRANSFORMS)}")
    return kind


def transform_images(X: torch.Tensor, kind: str, train: bool) -> torch.Tensor:
    """``X`` ``[N, C, H, W]`` -> transformed copy (``kind`` "none": ``X`` itself)."""
    if check_transform(kind) == "none":
        return X
    N, _, H, W = X.shape
    gen = torch.Generator().manual_seed(int(train))
    u = torch.rand(N, 2, generator=gen) * 2 - 1
    theta = torch.zeros(N, 2, 3)
    if kind.startswith("rotated"):
        angle = u[:, 0] * (math.pi if kind == "rotated_full" else math.pi / 2)
        c, s = angle.cos(), angle.sin()
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = c, -s, s, c
    else:  # translated: 8 px of a 28 px image in align_corners=True units (2 / (W - 1) per pixel)
        theta[:, 0, 0] = theta[:, 1, 1] = 1.0
        theta[:, 0, 2] = u[:, 0] * 8 * 2 / (W - 1)
        theta[:, 1, 2] = u[:, 1] * 8 * 2 / (H - 1)
    out = []
    for i in range(0, N, 4096):  # chunks: bounded memory for 60k images
        grid = F.affine_grid(theta[i:i + 4096], [min(4096, N - i), *X.shape[1:]], align_corners=True)
        out.append(F.grid_sample(X[i:i + 4096].float(), grid, mode="bilinear", align_corners=True))
    return torch.cat(out).clamp_(0.0, 1.0).to(X.dtype)
