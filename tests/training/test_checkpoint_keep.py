"""``checkpoint.enabled``: only ``last.ckpt`` is kept (not one file per epoch), plus the best by
``checkpoint.monitor`` when set."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.train import build_callbacks
from laplace_lab.training import MAPModule


@pytest.mark.parametrize("monitor,want", [(None, ["last.ckpt"]), ("val/nll", ["best-epoch", "last.ckpt"])])
def test_checkpoints_kept(tmp_path, monitor, want):
    cfg = OmegaConf.create({"marglik": {"mode": "off"}, "checkpoint": {
        "enabled": True, "dirpath": str(tmp_path / "ckpt"), "every_n_epochs": 1, "monitor": monitor, "mode": "min"}})
    dm = LabDataModule(batch_size=10, seed=0)
    dm.train_set = dm.val_set = dm.test_set = TensorDataset(torch.randn(20, 2), torch.randn(20, 1))
    module = MAPModule(nn.Linear(2, 1), "regression", n_data=20, optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    trainer = pl.Trainer(max_epochs=4, logger=False, callbacks=build_callbacks(cfg, tmp_path), accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(files) == len(want) and all(f.startswith(w) for f, w in zip(files, want))
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 8  # 4 epochs x 2 batches
