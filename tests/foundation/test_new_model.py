"""A network declares its options on its class (``models.base.LabModel``: ``Options`` of
``fields.option`` fields), as a data module does, so a new network is two files: its class in
``src/laplace_lab/models/`` and its yaml in ``conf/model/``. This test writes exactly those two (a
module on the ``laplace_lab.models`` package's path, a yaml on Hydra's search path) and runs the
config check and a short training job; then the built-in networks' options: checked before any data
loads, with the messages of the config check, and their constructors' call forms unchanged."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import laplace_lab.models
import laplace_lab.training.build as build_mod
from laplace_lab.config.load import load_run_config
from laplace_lab.config.targets import MODELS
from laplace_lab.config.values import RANGES
from laplace_lab.models import MLP, LeNet, ResNet18, WideResNet
from laplace_lab.models.registry import REGISTRY, model_class
from laplace_lab.train import run
from tests.conftest import add_two_files, compose_config

TARGET = "laplace_lab.models.gated.GatedNet"

CLASS_FILE = '''
"""x -> Linear -> tanh * sigmoid gate -> Linear: a network that only this test adds."""

from dataclasses import dataclass
import math

import torch
from torch import nn

from laplace_lab.io.fields import option
from laplace_lab.models.base import LabModel


class GatedNet(LabModel, nn.Module):
    @dataclass(frozen=True)
    class Options:
        hidden: int = option(8, "int", low=1)

    def __init__(self, input_shape, num_outputs, *args, **options):
        o = self.bind_options(args, options)
        super().__init__()
        self.inner = nn.Linear(math.prod(input_shape), 2 * o.hidden)
        self.out = nn.Linear(o.hidden, num_outputs)

    def forward(self, x):
        a, b = self.inner(x.flatten(1)).chunk(2, dim=1)
        return self.out(torch.tanh(a) * torch.sigmoid(b))
'''

YAML_FILE = f"""
defaults:
  - /schema/model/gatednet@_here_
  - _self_

_target_: {TARGET}
_partial_: true
hidden: 6
"""

FAST = ["data=sinusoid", "trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false",
        "evaluation.progress=false"]


@pytest.fixture
def gated_model(tmp_path, monkeypatch):
    """The two files of a new network; returns the overrides that compose with it."""
    yield add_two_files(tmp_path, monkeypatch, laplace_lab.models, "gated", CLASS_FILE, "model", YAML_FILE)
    sys.modules.pop("laplace_lab.models.gated", None)


def test_a_new_network_is_a_class_and_a_yaml(gated_model, tmp_path):
    cfg = compose_config([*gated_model, *FAST])
    job = load_run_config(cfg)  # the target is allowed, its options read from its class
    assert job.model["hidden"] == 6 and model_class(TARGET) is not None and TARGET in MODELS
    metrics = run(cfg, tmp_path / "run")
    assert metrics["test/map/rmse"] == metrics["test/map/rmse"] and (tmp_path / "run" / "metrics.json").exists()
    with pytest.raises(ValueError, match=r"model.hidden must be >= 1; got 0 \(allowed: integers in \[1, inf\)\)"):
        load_run_config(compose_config([*gated_model, *FAST, "model.hidden=0"]))


@pytest.mark.parametrize("overrides,pattern", [
    (["model.widths=[8,0]"], r"model.widths\[1\] must be >= 1; got 0 \(allowed: integers in \[1, inf\)\)"),
    (["model.activation=sigmoid"], r"model.activation='sigmoid' is not supported; allowed: \['elu', 'gelu', 'relu'"),
    (["model.norm=layer"], r"model.norm='layer' is not supported; allowed: \['batchnorm', 'none'\]"),
    (["+model.width=3"], r"model.width is not a known option of the model group; allowed: "
                         r"\['activation', 'norm', 'widths'\]"),
    (["model=lenet", "model.activation=[relu]"], r"model.activation=\['relu'\] has the wrong type: got a list; "
                                                 r"allowed: a str"),
    (["model=resnet18", "model.width=2.5"], r"model.width must be >= 1; got 2.5 \(allowed: integers in \[1, inf\)\)"),
    (["model=wrn16_4", "model.depth=4"], r"model.depth must be >= 10; got 4 \(allowed: integers in \[10, inf\)\)"),
])
def test_model_options_are_checked_before_any_data_loads(overrides, pattern, tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "instantiate", lambda *a, **k: pytest.fail("built before the error"))
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([*FAST, *overrides]), tmp_path)


def test_each_option_is_declared_once_on_its_class():
    assert not [key for key in RANGES if key.startswith("model.")]
    assert set(REGISTRY.classes()) == {f"laplace_lab.models.{c.__name__}" for c in (MLP, LeNet, ResNet18, WideResNet)}
    assert dataclasses.asdict(MLP.Options()) == {"widths": [50], "activation": "relu", "norm": "none"}
    assert dataclasses.asdict(WideResNet.Options()) == {"depth": 16, "widen_factor": 4, "norm": "batchnorm"}


def test_constructor_calls_keep_their_forms():
    torch.manual_seed(0)
    positional = MLP((1, 8, 8), 3, [6, 5], "tanh", norm="batchnorm")
    torch.manual_seed(0)
    keywords = MLP(input_shape=(1, 8, 8), num_outputs=3, widths=(6, 5), activation="tanh", norm="batchnorm")
    assert positional.options == keywords.options == MLP.Options(widths=[6, 5], activation="tanh", norm="batchnorm")
    for a, b in zip(positional.state_dict().values(), keywords.state_dict().values()):
        assert torch.equal(a, b)
    assert [type(m).__name__ for m in positional][-3:] == ["BatchNorm1d", "Tanh", "Linear"]
    assert LeNet((1, 28, 28), 10).options == LeNet.Options()
    with pytest.raises(TypeError, match="got multiple values for argument 'widths'"):
        MLP((2,), 2, [5], widths=[3])
    with pytest.raises(TypeError, match=r"takes 2 option arguments \(\['activation', 'norm'\]\); got 3"):
        LeNet((1, 28, 28), 10, "relu", "none", 1)
    with pytest.raises(ValueError, match=r"model.depth must be 6n\+4"):
        WideResNet((3, 32, 32), 10, depth=12)
