"""Small Lightning setups for the online-marglik tests."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.training import MAPModule
from laplace_lab.training.module import MAPOptimisation
from laplace_lab.training.online_marglik import OnlineMarglik, OnlineMarglikOptions


class TensorDataModule(LabDataModule):
    """Regression data held as tensors; train = val = test (the tests only look at hyperparameters)."""

    task = "regression"

    def __init__(self, X: torch.Tensor, y: torch.Tensor, batch_size: int):
        super().__init__(batch_size=batch_size, eval_batch_size=len(X))
        self.input_shape, self.num_outputs = tuple(X.shape[1:]), y.shape[1]
        self.train_set = self.val_set = self.test_set = TensorDataset(X, y)
        self.target_mean, self.target_std = torch.zeros(1), torch.ones(1)


def fit_online(model, dm, epochs, lr=1e-2, callback_kwargs=None, trainer_kwargs=None, prior=1.0, sigma=1.0,
               ckpt_path=None, extra_callbacks=()):
    """Train ``model`` with online marglik; returns (module, callback, trainer)."""
    module = MAPModule(model, "regression", n_data=len(dm.train_set),
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.Adam(p, lr=lr)),
                       prior_precision=prior, sigma_noise=sigma)
    kwargs = dict(laplace_kwargs={"subset_of_weights": "all", "hessian_structure": "full", "curvature": "ggn"},
                  prior_structure="scalar", frequency=1, n_steps=10, lr_hyp=0.1, early_stopping=False)
    kwargs.update(callback_kwargs or {})
    callback = OnlineMarglik(OnlineMarglikOptions(**kwargs))
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=bool(extra_callbacks),
                         enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[callback, *extra_callbacks], accelerator="cpu", **(trainer_kwargs or {}))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, callback, trainer
