"""Training-loss logging cadence: every epoch when an epoch has at least ``log_every_n_steps``
batches, else every ``ceil(log_every_n_steps / batches)``-th epoch and the last."""

from __future__ import annotations

import csv

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from laplace_lab.data.base import LabDataModule
from laplace_lab.training import MAPModule
from laplace_lab.training.module import MAPOptimisation


def _logged_epochs(tmp_path, batch_size, log_every, epochs=12):
    from torch.utils.data import TensorDataset

    dm = LabDataModule(batch_size=batch_size, seed=0)
    dm.train_set = TensorDataset(torch.randn(20, 2), torch.randn(20, 1))
    dm.val_set = dm.test_set = TensorDataset(torch.randn(0, 2), torch.randn(0, 1))
    module = MAPModule(nn.Linear(2, 1), "regression", n_data=20,
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.01)))
    logger = pl.loggers.CSVLogger(tmp_path)
    trainer = pl.Trainer(max_epochs=epochs, logger=logger, log_every_n_steps=log_every, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    with open(f"{logger.log_dir}/metrics.csv") as f:
        return [int(r["epoch"]) + 1 for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.parametrize("batch_size,log_every,want", [
    (20, 5, [5, 10, 12]),        # full batch: every 5th epoch and the last
    (10, 5, [3, 6, 9, 12]),      # 2 batches per epoch: every ceil(5 / 2) = 3rd epoch
    (4, 5, list(range(1, 13))),  # 5 batches per epoch: every epoch
])
def test_train_loss_rows(tmp_path, batch_size, log_every, want):
    assert _logged_epochs(tmp_path, batch_size, log_every) == want
