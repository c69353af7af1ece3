"""Dataset shift: rotated test images and CIFAR-10-C.

Rotation uses ``torchvision.transforms.functional.rotate`` on image batches ``[B, C, H, W]``
(counter-clockwise degrees, nearest interpolation, zero fill), as in rotated-MNIST
(Ovadia et al. 2019; Daxberger et al. 2021).

CIFAR-10-C (Hendrycks & Dietterich 2019) is read from the standard release files
``<data_dir>/CIFAR-10-C/<corruption>.npy`` (``uint8 [50000, 32, 32, 3]``, severities 1..5
stacked in blocks of 10000) and ``labels.npy``. It cannot be downloaded by torchvision; get it
from https://zenodo.org/record/2535967 and unpack it into ``<data_dir>/CIFAR-10-C/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

CIFAR10C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform",
    "pixelate", "jpeg_compression",  # the 15 of the benchmark
    "speckle_noise", "gaussian_blur", "spatter", "saturate",  # the 4 extra ones
)
CIFAR10C_PER_SEVERITY = 10000


def rotate_images(x: Tensor, angle: float) -> Tensor:
    """Rotate a batch of images ``[B, C, H, W]`` by ``angle`` degrees (counter-clockwise)."""
    if x.ndim != 4:
        raise ValueError(f"rotation needs image batches [B, C, H, W]; got {tuple(x.shape)}")
    if angle == 0:
        return x
    from torchvision.transforms import InterpolationMode  # seconds to import (torch._dynamo)
    from torchvision.transforms import functional as TF

    return TF.rotate(x, float(angle), interpolation=InterpolationMode.NEAREST)


def rotated_batches(batches: Iterable, angle: float) -> Iterator[tuple[Tensor, Tensor]]:
    for x, y in batches:
        yield rotate_images(x, angle), y


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """``data_dir``, else ``$LAPLACE_LAB_DATA_DIR``, else ``data``."""
    return Path(data_dir or os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))


def cifar10c_status(data_dir, corruptions: Iterable[str] | None = None) -> tuple[list[str], str]:
    """``(available corruptions, reason)``; an empty list comes with the reason why."""
    root = resolve_data_dir(data_dir) / "CIFAR-10-C"
    wanted = list(CIFAR10C_CORRUPTIONS if corruptions is None else corruptions)
    unknown = [c for c in wanted if c not in CIFAR10C_CORRUPTIONS]
    if unknown:
        raise ValueError(
            f"evaluation.shift.cifar10c.corruptions has unknown names {unknown}; "
            f"allowed: {list(CIFAR10C_CORRUPTIONS)}"
        )
    if not (root / "labels.npy").exists():
        return [], f"CIFAR-10-C not found: expected {root}/labels.npy and {root}/<corruption>.npy"
    present = [c for c in wanted if (root / f"{c}.npy").exists()]
    if not present:
        return [], f"no corruption files {wanted} in {root}"
    missing = sorted(set(wanted) - set(present))
    reason = f"missing in {root}: {missing}" if (missing and corruptions is not None) else ""
    return present, reason


def load_cifar10c(data_dir, corruption: str, severity: int, max_items: int | None = None) -> TensorDataset:
    """Images ``float [N, 3, 32, 32]`` in [0, 1] and labels ``[N]`` of one corruption/severity."""
    if not 1 <= severity <= 5:
        raise ValueError(f"CIFAR-10-C severity must be in 1..5; got {severity}")
    root = resolve_data_dir(data_dir) / "CIFAR-10-C"
    images = np.load(root / f"{corruption}.npy", mmap_mode="r")
    labels = np.load(root / "labels.npy", mmap_mode="r")
    n = CIFAR10C_PER_SEVERITY if len(images) >= 5 * CIFAR10C_PER_SEVERITY else len(images) // 5
    lo = (severity - 1) * n
    hi = lo + (n if max_items is None else min(n, max_items))
    x = torch.from_numpy(np.array(images[lo:hi])).permute(0, 3, 1, 2).float() / 255.0
    y = torch.from_numpy(np.array(labels[lo:hi])).long()
    return TensorDataset(x, y)
