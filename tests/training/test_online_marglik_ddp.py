"""Online marglik under Lightning DDP (2 CPU processes, gloo): the callback fits the Laplace on
every rank's shard, the engine sums the shards, and the hyper steps, run on every rank, give the
hyperparameters of the one-process run."""

from __future__ import annotations

import functools

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from laplace_lab.training import MAPModule
from laplace_lab.training.module import MAPOptimisation
from laplace_lab.training.online_marglik import OnlineMarglik, OnlineMarglikOptions
from tests.training.marglik_helpers import TensorDataModule


def run(devices: int):
    torch.manual_seed(0)
    X = torch.randn(40, 3, dtype=torch.float64)
    y = torch.sin(X @ torch.tensor([[1.0], [-0.5], [0.25]], dtype=torch.float64)) + 0.1 * torch.randn(40, 1, dtype=torch.float64)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    # full batch: on 2 processes each rank's batch is its half, DDP averages the two halves' mean gradients
    dm = TensorDataModule(X, y, batch_size=40 // devices)
    module = MAPModule(model, "regression", n_data=len(X),
                       optimisation=MAPOptimisation(optimizer=functools.partial(torch.optim.Adam, lr=1e-2)),
                       prior_precision=1.0, sigma_noise=1.0)  # picklable, as ddp_spawn would need
    callback = OnlineMarglik(OnlineMarglikOptions(laplace_kwargs={"subset_of_weights": "all", "hessian_structure": "kron",
                                                                  "curvature": "ggn"},
                                                  prior_structure="layerwise", frequency=1, n_steps=10, lr_hyp=0.1, early_stopping=False,
                                                  optimize_sigma=True, fit_batch_size=10))  # 4 fit batches: 2 per rank
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[callback], accelerator="cpu", devices=devices,
                         **({"strategy": "ddp_fork"} if devices > 1 else {}))
    trainer.fit(module, datamodule=dm)
    return module


@pytest.mark.slow
def test_ddp_online_marglik_equals_one_process():
    one, two = run(1), run(2)
    for name in ("prior_precision", "log_sigma_noise"):
        a, b = getattr(one, name), getattr(two, name)
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10), (name, a, b)
    for (n, a), (_, b) in zip(one.model.state_dict().items(), two.model.state_dict().items()):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10), n
    assert not torch.equal(one.prior_precision, torch.ones_like(one.prior_precision))  # the hyper steps moved it
