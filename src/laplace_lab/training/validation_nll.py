"""The validation NLL of a MAP network: the ``val/nll`` that ``map_grid`` chooses by and that a
network loaded from the MAP cache reports (``training.fit.cached_validation``)."""

from __future__ import annotations

import torch

from laplace_lab.data.base import LabDataModule
from laplace_lab.training.module import MAPCore


def validation_nll(module: MAPCore, datamodule: LabDataModule) -> float:
    """Mean NLL of the MAP network on the validation set."""
    module.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in datamodule.val_dataloader():
            total += float(module.nll(module(x), y))
            n += len(x)
    return total / n
