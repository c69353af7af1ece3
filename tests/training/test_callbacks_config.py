"""The training callbacks built from ``conf/callbacks/``: a callback class gets its typed options from
the run's config groups (``options_type.from_run``) and is left out where the run does not use it."""

from __future__ import annotations

import dataclasses

import pytest

from laplace_lab.training.epoch_eta import EpochETA
from laplace_lab.training.fit import build_callbacks
from laplace_lab.training.invariance_marglik import (
    AugmentationMarglikCore,
    AugmentationMarglikOptions,
)
from laplace_lab.training.loops import PLAIN
from laplace_lab.training.online_marglik import (
    FROM_MARGLIK,
    OnlineMarglikCore,
    OnlineMarglikOptions,
)
from tests.conftest import run_config


def test_online_marglik_takes_its_options_from_the_config(tmp_path):
    run = run_config(["data=sinusoid", "marglik=online", "marglik.n_steps=7", "marglik.frequency=2",
                      "marglik.lr_hyp_min=0.01", "curvature=kron", "curvature.fit_batch_size=32", "prior=scalar"])
    online, eta = build_callbacks(run, tmp_path, loop=PLAIN)
    assert (type(online), type(eta)) == (OnlineMarglikCore, EpochETA)
    assert online.options == OnlineMarglikOptions(
        run.curvature.laplace_kwargs(), prior_structure="scalar", fit_batch_size=32,
        **{k: getattr(run.marglik, k) for k in FROM_MARGLIK})
    assert (online.n_steps, online.frequency, online.lr_hyp_min, online.fit_batch_size) == (7, 2, 0.01, 32)
    assert online.laplace_kwargs["hessian_structure"] == "kron"


def test_callbacks_the_run_does_not_use_are_left_out(tmp_path):
    run = run_config(["data=sinusoid"])  # marglik off, no augmentation
    assert OnlineMarglikOptions.from_run(run) is None and AugmentationMarglikOptions.from_run(run) is None
    assert [type(cb) for cb in build_callbacks(run, tmp_path, loop=PLAIN)] == [EpochETA]


def test_augmentation_options_from_the_config():
    run = run_config(["data=mnist", "model=lenet", "method=online_kron", "augmentation=learned",
                      "augmentation.lr=0.2", "curvature.type=ef", "marglik.burnin=3", "predictive=map"])
    options = AugmentationMarglikOptions.from_run(run)
    assert options == AugmentationMarglikOptions(learn=True, structure="kron", curvature_type="ef",
                                                 frequency=run.marglik.frequency, burnin=3, lr=0.2,
                                                 lr_min=run.augmentation.lr_min, fit_batch_size=None,
                                                 subset_all=True)
    assert AugmentationMarglikCore(options).curvature_type == "ef"
    fixed = run_config(["data=mnist", "model=lenet", "method=online_kron", "augmentation=fixed", "predictive=map"])
    assert AugmentationMarglikOptions.from_run(fixed).learn is False


def test_bad_online_options_are_refused_naming_the_option():
    kwargs = {"subset_of_weights": "all", "hessian_structure": "kron", "curvature": "ggn"}
    with pytest.raises(ValueError, match=r"prior.structure='blocks'; allowed: \['scalar'"):
        OnlineMarglikOptions(kwargs, prior_structure="blocks")
    with pytest.raises(ValueError, match="marglik.frequency >= 1"):
        OnlineMarglikOptions(kwargs, frequency=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        OnlineMarglikOptions(kwargs).n_steps = 3
