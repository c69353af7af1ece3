"""Bad input fails before training, with a message that names the option and the choices."""

from __future__ import annotations

import pytest
from hydra.errors import MissingConfigException

import laplace_lab.train as train_mod
from laplace_lab.train import run
from tests.conftest import compose_config


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a Trainer is ever built: errors must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("training started before the error")

    monkeypatch.setattr(train_mod.pl, "Trainer", forbidden)


def test_unknown_model_group_option():
    with pytest.raises(MissingConfigException, match="mlp"):
        compose_config(["model=transformer9000"])


def test_unknown_dataset_group_option():
    with pytest.raises(MissingConfigException, match="mnist"):
        compose_config(["data=imagenet"])


def test_unknown_vision_name(tmp_path, no_training):
    with pytest.raises(ValueError, match=r"data.name='imagenet'.*allowed.*mnist"):
        run(compose_config(["data=mnist", "data.name=imagenet", "logger=csv"]), tmp_path)


def test_unknown_uci_name(tmp_path, no_training):
    with pytest.raises(ValueError, match=r"data.name='iris'.*allowed.*yacht"):
        run(compose_config(["data=uci", "data.name=iris", "logger=csv"]), tmp_path)


def test_missing_data_directory(tmp_path, no_training):
    missing = tmp_path / "nowhere"
    cfg = compose_config(["data=mnist", f"paths.data_dir={missing}", "data.download=false", "logger=csv"])
    with pytest.raises(FileNotFoundError, match=r"'mnist'.*nowhere.*train-images-idx3-ubyte"):
        run(cfg, tmp_path)
    cfg = compose_config(["data=uci", f"paths.data_dir={missing}", "logger=csv"])
    with pytest.raises(FileNotFoundError, match=r"'yacht'.*nowhere.*data.txt"):
        run(cfg, tmp_path)


def test_uci_split_out_of_range(tmp_path, data_dir, no_training):
    cfg = compose_config(["data=uci", "data.split=20", f"paths.data_dir={data_dir}", "logger=csv"])
    with pytest.raises(ValueError, match=r"data.split=20.*allowed: 0..19"):
        run(cfg, tmp_path)


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("optimizer.weight_decay=0.01", r"optimizer.weight_decay.*allowed: 0"),
        ("likelihood=poisson", r"likelihood='poisson'.*allowed"),
        ("prior.prior_precision=-1", r"prior.prior_precision must be a positive"),
        ("prior=diagonal", r"prior.structure=.diagonal. does not fit curvature.hessian_structure=.kron."),
        ("curvature.type=hessian", r"curvature.type=.hessian.*allowed"),
        ("model.activation=swish9", r"model.activation='swish9'.*allowed"),
        ("prior_in_map_loss=maybe", r"prior_in_map_loss must be true or false"),
    ],
)
def test_invalid_values(override, pattern, tmp_path, no_training):
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([override, "logger=csv"]), tmp_path)


@pytest.mark.parametrize("extra", [["method=online_full"], ["method=map_grid"]])
def test_map_loss_without_prior_rejects_online_and_grid(extra, tmp_path, no_training):
    cfg = compose_config(["prior_in_map_loss=false", "logger=csv", *extra])
    with pytest.raises(ValueError, match=r"prior_in_map_loss=false needs marglik.mode in \['off', 'posthoc'\]"):
        run(cfg, tmp_path)
