"""A regression run whose MAP network does no better than predicting the mean gets a warning."""

from __future__ import annotations

import logging

import torch

from laplace_lab.data.base import LabDataModule

log = logging.getLogger(__name__)


def train_target_std(datamodule: LabDataModule) -> float:
    """Std of the training targets in original units (over all outputs): the RMSE of predicting
    their mean."""
    mean = 0.0 if datamodule.target_mean is None else datamodule.target_mean
    std = 1.0 if datamodule.target_std is None else datamodule.target_std
    y = torch.cat([y.reshape(len(y), -1) for _, y in datamodule.train_eval_dataloader()]) * std + mean
    return float((y - y.mean(0)).pow(2).mean().sqrt())


def warn_if_underfit(metrics: dict[str, float], target_std: float) -> bool:
    """Log a warning when the MAP test RMSE (original units) is not below the training targets' std
    ``target_std``, i.e. the network does no better than predicting the mean: almost always too few
    training steps (``trainer.max_epochs``) for a small dataset. Returns whether it warned."""
    rmse = metrics.get("test/map/rmse")
    if rmse is None or rmse < target_std:
        return False
    log.warning("Under-trained? test/map/rmse %.4g >= the target std %.4g (predicting the mean does as well): "
                "raise trainer.max_epochs (small UCI sets need hundreds of epochs; see docs/configuration.md)", rmse, target_std)
    return True
