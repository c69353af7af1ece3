"""A new in-memory data set is two files: its class in ``src/laplace_lab/data/`` and its yaml in
``conf/data/`` (docs/configuration.md, "How to add a dataset"). This test writes exactly those two, a
module into a temporary folder on the ``laplace_lab.data`` package's path and a yaml into a temporary
config folder on Hydra's search path, and runs the config check, the loop choice and a short training
job with nothing else edited."""

from __future__ import annotations

import sys

import pytest

import laplace_lab.data
import laplace_lab.training.build as build_mod
from laplace_lab.config.load import load_run_config
from laplace_lab.data.registry import data_class, data_modules
from laplace_lab.train import run
from laplace_lab.training.loop_choice import choose_loop, lightning_needs
from tests.conftest import add_two_files, compose_config

TARGET = "laplace_lab.data.line.LineDataModule"

CLASS_FILE = '''
"""y = slope * x on [-1, 1]: a data set that only this test adds."""

from dataclasses import dataclass

import torch
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.io.fields import option


class LineDataModule(LabDataModule):
    @dataclass(frozen=True)
    class Options(LabDataModule.Options):
        slope: float = option(2.0, "float", low=0, low_open=True)

    task = "regression"
    input_shape = (1,)
    num_outputs = 1
    in_memory = True

    def __init__(self, **options):
        super().__init__(**options)
        x = torch.linspace(-1, 1, 60)[:, None]
        y = self.options.slope * x
        self.train_set, self.val_set, self.test_set = (TensorDataset(x[i::3], y[i::3]) for i in range(3))
        self.target_mean, self.target_std = torch.zeros(1), torch.ones(1)
'''

YAML_FILE = f"""
defaults:
  - /schema/data/line@_here_
  - _self_

_target_: {TARGET}
slope: 3.0
batch_size: 10
seed: ${{seed}}
"""

FAST = ["trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false", "evaluation.progress=false",
        "model=mlp", "model.widths=[4]"]


@pytest.fixture
def line_dataset(tmp_path, monkeypatch):
    """The two files of a new data set; returns the overrides that compose with it."""
    yield add_two_files(tmp_path, monkeypatch, laplace_lab.data, "line", CLASS_FILE, "data", YAML_FILE)
    sys.modules.pop("laplace_lab.data.line", None)


def test_a_new_in_memory_dataset_is_a_class_and_a_yaml(line_dataset, tmp_path):
    cfg = compose_config([*line_dataset, *FAST])
    job = load_run_config(cfg)  # the target is allowed, its options read from its class
    assert job.data["slope"] == 3.0 and data_class(TARGET) is not None and TARGET in data_modules()
    assert lightning_needs(job) == [] and choose_loop(job).name == "plain"  # it declares in_memory
    metrics = run(cfg, tmp_path / "run")
    assert metrics["test/map/rmse"] == metrics["test/map/rmse"] and (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize("overrides,pattern", [
    (["data.slope=0"], r"data.slope must be > 0; got 0 \(allowed: numbers in \(0, inf\)\)"),
    (["data.slope=steep"], r"data.slope='steep' has the wrong type: got a str; allowed: a number"),
    (["+data.slop=1"], r"data.slop is not a known option of the data group; allowed: \[.*'slope'"),
    (["map_grid=[1.0,10.0]", "map_grid_refit=true"], r"map_grid_refit=true needs data whose validation rows are "
                                                       rf"held out .*; data '{TARGET}' draws its validation set apart"),
])
def test_its_options_are_checked_before_any_data_loads(line_dataset, overrides, pattern, tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "instantiate", lambda *a, **k: pytest.fail("data built before the error"))
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([*line_dataset, *FAST, *overrides]), tmp_path)


def test_a_target_outside_the_data_modules_is_refused():
    assert data_class("laplace_lab.data.base.LabDataModule") is None  # the base class
    assert data_class("laplace_lab.data.vision.torch") is None  # not a class
    assert data_class("laplace_lab.data.toy.Toy2DDataModule") is None  # exported: only laplace_lab.data.<Class>
    assert data_class("laplace_lab.data.Toy2DDataModule") is not None
