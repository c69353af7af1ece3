"""``checkpoint.enabled``: only ``last.ckpt`` is kept (not one file per epoch), rewritten after
every epoch (what a cut-off run resumes), plus the best by ``checkpoint.monitor`` when set."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.training import MAPModule
from laplace_lab.training.fit import build_callbacks
from laplace_lab.training.module import MAPOptimisation
from tests.conftest import run_config


class LastStep(pl.Callback):
    """At each epoch's start, the global step saved in last.ckpt (None: no file yet)."""

    def __init__(self, path):
        self.path, self.steps = path, []

    def on_train_epoch_start(self, trainer, module):
        self.steps.append(torch.load(self.path, weights_only=False)["global_step"] if self.path.exists() else None)


@pytest.mark.parametrize("monitor,want", [(None, ["last.ckpt"]), ("val/nll", ["best-epoch", "last.ckpt"])])
def test_checkpoints_kept(tmp_path, monitor, want):
    cfg = run_config(["method=map", "checkpoint.enabled=true", f"checkpoint.dirpath={tmp_path / 'ckpt'}",
                      "checkpoint.every_n_epochs=1", f"checkpoint.monitor={monitor or 'null'}", "checkpoint.mode=min"])
    dm = LabDataModule(batch_size=10, seed=0)
    dm.train_set = dm.val_set = dm.test_set = TensorDataset(torch.randn(20, 2), torch.randn(20, 1))
    module = MAPModule(nn.Linear(2, 1), "regression", n_data=20,
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.SGD(p, lr=0.01)))
    seen = LastStep(tmp_path / "ckpt" / "last.ckpt")
    trainer = pl.Trainer(max_epochs=4, logger=False, callbacks=[seen, *build_callbacks(cfg, tmp_path)], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(files) == len(want) and all(f.startswith(w) for f, w in zip(files, want))
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 8  # 4 epochs x 2 batches
    assert seen.steps == [None, 2, 4, 6]  # rewritten after every epoch, not only at the end
