"""Per-step learning-rate schedules (``training.schedules``, ``lr_scheduler=cosine_per_step``):
the lr after every optimiser step follows the closed-form cosine over epochs x batches, under
Lightning's Trainer and the plain loop alike; bad input is refused before training."""

from __future__ import annotations

import math

import hydra
import pytest
import torch

from laplace_lab.data import SinusoidDataModule
from laplace_lab.training.module import MAPCore, MAPOptimisation
from laplace_lab.training.plain_loop import PlainTrainer, _optimizer_and_scheduler
from laplace_lab.training.schedules import StepwiseCosine, scheduler_interval
from tests.conftest import compose_config

LR, EPOCHS, N_TRAIN, BATCH = 0.1, 3, 40, 16  # 3 batches per epoch (16, 16, 8)


class _Recorder:
    """Module mixin: the lr each training step runs with."""

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.the_optimizer.param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)


def _module(base, schedule):
    recorder = type("Recorded", (_Recorder, base), {})

    def optimizer(params):
        module.the_optimizer = torch.optim.SGD(params, lr=LR)
        return module.the_optimizer

    module = recorder(model=torch.nn.Linear(1, 1), likelihood="regression", n_data=N_TRAIN,
                      optimisation=MAPOptimisation(optimizer=optimizer, lr_scheduler=schedule))
    module.lrs = []
    return module


def _data():
    return SinusoidDataModule(n_train=N_TRAIN, n_val=0, n_test=10, batch_size=BATCH, seed=0)


def _closed_form(total_steps, eta_min=0.0):
    return [eta_min + (LR - eta_min) * (1 + math.cos(math.pi * t / total_steps)) / 2 for t in range(total_steps)]


def _fit(loop, schedule):
    if loop == "plain":
        module = _module(MAPCore, schedule)
        PlainTrainer(max_epochs=EPOCHS, device=torch.device("cpu")).fit(module, _data())
    else:
        import pytorch_lightning as pl

        from laplace_lab.training.lightning_classes import MAPModule

        module = _module(MAPModule, schedule)
        pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False).fit(module, datamodule=_data())
    return module.lrs


@pytest.mark.parametrize("loop", ["plain", "lightning"])
def test_cosine_per_step_follows_the_closed_form_every_step(loop):
    steps = EPOCHS * math.ceil(N_TRAIN / BATCH)
    lrs = _fit(loop, StepwiseCosine(eta_min=1e-3))
    assert len(lrs) == steps
    assert lrs == pytest.approx(_closed_form(steps, eta_min=1e-3), rel=1e-12, abs=1e-15)
    assert len(set(lrs[:3])) == 3  # changes within an epoch


@pytest.mark.parametrize("loop", ["plain", "lightning"])
def test_cosine_per_epoch_is_constant_within_an_epoch(loop):
    lrs = _fit(loop, hydra.utils.instantiate(compose_config(["lr_scheduler=cosine",
                                                             f"trainer.max_epochs={EPOCHS}"]).lr_scheduler))
    per_epoch = _closed_form(EPOCHS)
    assert lrs == pytest.approx([lr for lr in per_epoch for _ in range(3)], rel=1e-12)


def test_the_config_group_builds_the_per_step_schedule():
    cfg = compose_config(["lr_scheduler=cosine_per_step"])
    factory = hydra.utils.instantiate(cfg.lr_scheduler)
    assert scheduler_interval(factory) == "step" and factory.eta_min == 0.0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    assert factory(opt, 10).T_max == 10


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="eta_min"):
        StepwiseCosine(eta_min=-1.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    with pytest.raises(ValueError, match="number of optimiser steps"):
        StepwiseCosine()(opt, 0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(ValueError, match="allowed intervals"):
        _optimizer_and_scheduler({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "batch"}})
    with pytest.raises(ValueError, match="trainer.loop=lightning"):
        _optimizer_and_scheduler({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "frequency": 2}})
    assert _optimizer_and_scheduler({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}})[2] == "step"
