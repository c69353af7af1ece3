"""The Lightning classes of laplace-lab: ``MAPCore``, ``OnlineMarglikCore``, ``AugmentationMarglikCore``
and ``EpochETA`` as a ``LightningModule`` and ``Callback``s, for Lightning's Trainer (``trainer.loop=lightning``).

Importing this module imports Lightning (seconds, with torchmetrics and what it pulls in); the
plain loop (``training.plain_loop``) runs the core classes without it. ``MAPModule`` and
``OnlineMarglik`` are also reachable as ``training.module.MAPModule`` and
``training.online_marglik.OnlineMarglik``, ``AugmentationMarglik`` as
``training.invariance_marglik.AugmentationMarglik`` (loaded on first use). Data modules need no class
here: ``data.base.LabDataModule`` becomes a ``LightningDataModule`` once Lightning is imported.
"""

from __future__ import annotations

import pytorch_lightning as pl

from laplace_lab.training.epoch_eta import EpochETA
from laplace_lab.training.invariance_marglik import AugmentationMarglikCore
from laplace_lab.training.module import MAPCore
from laplace_lab.training.online_marglik import OnlineMarglikCore


class MAPModule(MAPCore, pl.LightningModule):
    """``MAPCore`` under Lightning: its steps and hooks, with Lightning's logging and trainer link
    (the names ``MAPCore`` defines for the plain loop are Lightning's here)."""

    trainer = pl.LightningModule.trainer
    current_epoch = pl.LightningModule.current_epoch

    def log_dict(self, values, **kwargs) -> None:
        """Lightning's ``log_dict``; over several processes (DDP) epoch values are averaged over the
        ranks (``sync_dist``): validation means of each rank's shard, hyperparameters (equal on every
        rank) unchanged, and no warning per key."""
        if kwargs.get("on_epoch", True) and self._trainer is not None and self._trainer.world_size > 1:
            kwargs.setdefault("sync_dist", True)
        pl.LightningModule.log_dict(self, values, **kwargs)


class OnlineMarglik(OnlineMarglikCore, pl.Callback):
    """``OnlineMarglikCore`` as a Lightning callback (checkpoint state under the key ``OnlineMarglik``)."""


class AugmentationMarglik(AugmentationMarglikCore, pl.Callback):
    """``AugmentationMarglikCore`` as a Lightning callback (checkpoint state under the key ``AugmentationMarglik``)."""


class EpochETACallback(EpochETA, pl.Callback):
    """``EpochETA`` (remaining training time after every epoch) as a Lightning callback."""


TWINS = {MAPCore: MAPModule, OnlineMarglikCore: OnlineMarglik, AugmentationMarglikCore: AugmentationMarglik,
         EpochETA: EpochETACallback}


def lightning_twin(cls: type) -> type:
    """The Lightning class of a core class (``MAPCore`` -> ``MAPModule``); a Lightning class itself."""
    if issubclass(cls, (pl.LightningModule, pl.Callback)):
        return cls
    if cls not in TWINS:
        raise ValueError(f"{cls.__module__}.{cls.__qualname__} has no Lightning class for trainer.loop=lightning; "
                         f"allowed: {[f'{c.__module__}.{c.__qualname__}' for c in TWINS]} or a Lightning class")
    return TWINS[cls]
