"""``laplace.precision``: TF32 off inside the engine's curvature and predictive on CUDA (the switches
restored after, the caller's choice elsewhere), ``set_tf32(True)`` to allow it. On a CPU-only machine
the CUDA branch is exercised by treating the CPU device as the engine's CUDA device."""

from __future__ import annotations

import logging

import pytest
import torch
from laplace_refs import cnn, data, loader
from torch import nn

from laplace_lab.laplace import Laplace, precision


@pytest.fixture
def switches():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    saved_state = dict(precision._state)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    precision._state.update(saved_state)


def test_no_tf32_switches_off_and_restores(switches, caplog):
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, True
    precision._state["logged"] = False
    with caplog.at_level(logging.INFO, logger="laplace_lab.laplace.precision"):
        with precision.no_tf32("cuda"):
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
            with precision.no_tf32("cuda:0"):  # nested: still off, and off again after the inner one
                pass
            assert not torch.backends.cudnn.allow_tf32
        with pytest.raises(RuntimeError, match="boom"), precision.no_tf32("cuda"):
            raise RuntimeError("boom")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    assert sum("TF32 off" in r.getMessage() for r in caplog.records) == 1  # logged once
    with precision.no_tf32("cpu"):  # not CUDA: untouched
        assert torch.backends.cudnn.allow_tf32
    precision.set_tf32(True)
    with precision.no_tf32("cuda"):  # allowed: the caller's switches
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(ValueError, match="set_tf32 takes True or False"):
        precision.set_tf32("yes")


class _Probe(nn.Module):
    """Identity that records cuDNN's TF32 switch whenever the network runs."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(torch.backends.cudnn.allow_tf32)
        return x


def test_fit_and_predictive_run_without_tf32(switches, monkeypatch):
    """Every engine entry point runs the network with TF32 off; the caller's switch is back after."""
    torch.backends.cudnn.allow_tf32 = True
    real = precision.no_tf32
    monkeypatch.setattr(precision, "no_tf32", lambda device: real("cuda"))  # the CPU stands in for CUDA
    probe = _Probe()
    model = nn.Sequential(probe, *cnn())
    X, y = data("cnn", "classification")
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    la.fit(loader(X, y, 6))
    la(X)
    la.predictive_samples(X, n_samples=2)
    la.functional_variance(torch.randn(2, 3, la.n_params, dtype=torch.float64))
    assert probe.seen and not any(probe.seen)
    assert torch.backends.cudnn.allow_tf32
    probe.seen.clear()
    model(X)  # outside the engine: the caller's choice
    assert probe.seen == [True]
