"""``curvature.fit_batch_size=auto`` (``training.fit_batch``): the eval batch on the CPU, the largest
batch that fits under the budget rule (CUDA's, run on the CPU with its device list patched), and an
online-marglik run whose fits at the chosen batch equal those at the eval batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import laplace_lab.laplace.backends.capture as capture_backend
from laplace_lab.laplace import Laplace, plan
from laplace_lab.training.fit_batch import fit_batch_size
from tests.training.marglik_helpers import TensorDataModule, fit_online


def _setup(eval_batch: int):
    torch.manual_seed(0)
    X = torch.randn(64, 2)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(64, 1)
    dm = TensorDataModule(X, y, batch_size=16)
    dm.eval_batch_size = eval_batch
    return dm


def _make():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))


KW = {"n_steps": 3, "laplace_kwargs": {"subset_of_weights": "all", "hessian_structure": "kron", "curvature": "ggn"}}


def _budget_rule_on_cpu(monkeypatch, available: int):
    for module in (capture_backend, plan):
        monkeypatch.setattr(module, "BUDGET_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(plan, "available_memory", lambda device: available)


def test_null_and_integers_pass_through_and_auto_is_the_eval_batch_on_the_cpu():
    dm = _setup(eval_batch=8)
    la = Laplace(_make(), "regression", subset_of_weights="all", hessian_structure="kron")
    assert fit_batch_size(None, dm, la) == (None, "") and fit_batch_size(5, dm, la) == (5, "")
    batch, note = fit_batch_size("auto", dm, la)
    assert batch == 8 and note.startswith("cpu: the eval batch")
    # online marglik: auto on the CPU runs exactly the fits of null (data.eval_batch_size)
    _, auto, _ = fit_online(_make(), dm, epochs=2, callback_kwargs={**KW, "fit_batch_size": "auto"})
    _, null, _ = fit_online(_make(), dm, epochs=2, callback_kwargs={**KW, "fit_batch_size": None})
    assert auto.fit_batch_size == 8
    assert [h["marglik/log_marglik"] for h in auto.history] == [h["marglik/log_marglik"] for h in null.history]


def test_auto_takes_the_largest_batch_that_fits_under_the_budget_rule(monkeypatch):
    dm = _setup(eval_batch=8)
    la = Laplace(_make(), "regression", subset_of_weights="all", hessian_structure="kron")
    X = dm.train_set.tensors[0][:8]
    held = {b: plan.laplace_plan(la, X, b, "cuda", limit=2**62)[0].fit for b in (8, 16, 32, 64)}
    assert held[16] < held[32]  # the peak grows with the batch from 16 on
    _budget_rule_on_cpu(monkeypatch, int((held[16] + held[32]) / 2 / plan.DEFAULT_MEMORY_BUDGET))
    assert fit_batch_size("auto", dm, la)[0] == 16
    _budget_rule_on_cpu(monkeypatch, 2**40)
    assert fit_batch_size("auto", dm, la)[0] == 64  # the training set caps it
    mc = Laplace(_make(), "regression", subset_of_weights="all", hessian_structure="kron", curvature="mc_fisher")
    batch, note = fit_batch_size("auto", dm, mc)
    assert batch == 8 and "mc_fisher" in note
    # online marglik at the chosen batch (64): the marglik steps of the eval batch's fits (8)
    _, auto, _ = fit_online(_make(), dm, epochs=2, callback_kwargs={**KW, "fit_batch_size": "auto"})
    _, null, _ = fit_online(_make(), dm, epochs=2, callback_kwargs={**KW, "fit_batch_size": None})
    assert auto.fit_batch_size == 64
    assert [h["marglik/log_marglik"] for h in auto.history] == pytest.approx(
        [h["marglik/log_marglik"] for h in null.history], rel=1e-6)
