"""Options that bound each other and runs that would train nothing fail before any data loads, naming
both options and the allowed values (``config.interplay``); a too-small UCI set says so."""

from __future__ import annotations

import pytest

import laplace_lab.training.build as build_mod
from laplace_lab.config.load import load_run_config
from laplace_lab.train import run
from tests.conftest import compose_config


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (["marglik=online", "marglik.lr_hyp=0.1", "marglik.lr_hyp_min=0.5"],
         r"marglik.lr_hyp_min=0.5 is above marglik.lr_hyp=0.1 .*allowed: marglik.lr_hyp_min null or in \[0, 0.1\]"),
        (["marglik=online", "marglik.log_min=3", "marglik.log_max=-3"],
         r"marglik.log_min=3 must be < marglik.log_max=-3 \(the clamp range"),
        (["marglik=online", "prior.prior_precision=1e-7"],
         r"prior.prior_precision=1e-07 lies outside the clamp range of online marglik, exp\(marglik.log_min=-12.0\)"),
        (["marglik=online", "data=sinusoid", "sigma_noise=1e6"],
         r"sigma_noise=1000000.0 lies outside the clamp range .*allowed: sigma_noise in \[6.144e-06, 1.628e\+05\]"),
        (["lr_scheduler=cosine", "optimizer.lr=0.01", "lr_scheduler.eta_min=0.1"],
         r"lr_scheduler.eta_min=0.1 is above optimizer.lr=0.01 .*allowed: lr_scheduler.eta_min in \[0, 0.01\]"),
        (["marglik=online", "trainer.max_epochs=5", "marglik.burnin=6"],
         r"marglik.burnin=6 and marglik.frequency=1 leave no marglik epoch within trainer.max_epochs=5"),
        (["marglik=online", "trainer.max_epochs=5", "marglik.frequency=7"],
         r"marglik.frequency=7 leave no marglik epoch within trainer.max_epochs=5"),
        (["trainer.limit_train_batches=0"], r"trainer.limit_train_batches=0 trains no batch: the untrained network"),
        (["trainer.limit_train_batches=0.0"], r"trainer.limit_train_batches=0 trains no batch"),
        (["+trainer.max_steps=0"], r"trainer.max_steps=0 trains no step"),
        (["trainer.max_epochs=0"], r"trainer.max_epochs must be >= 1 or null; got 0"),
        (["data=uci", "data.val_fraction=1.0"],
         r"data.val_fraction must be >= 0 and < 1; got 1.0 \(allowed: numbers in \[0, 1\)\)"),
    ],
)
def test_interacting_options_fail_before_data(overrides, pattern, tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "instantiate", lambda *a, **k: pytest.fail("data or model built before the error"))
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([*overrides, "logger=csv"]), tmp_path)


@pytest.mark.parametrize("overrides", [
    ["marglik=online", "marglik.lr_hyp=0.1", "marglik.lr_hyp_min=0.1"],
    ["marglik=online", "marglik.lr_hyp_min=0.0"],
    ["marglik=online", "prior.prior_precision=1e-5", "marglik.log_min=-12"],
    ["marglik=posthoc", "prior.prior_precision=1e-7"],
    ["marglik=online", "trainer.max_epochs=5", "marglik.burnin=5"],
    ["marglik=online", "trainer.max_epochs=5", "marglik.frequency=5"],
    ["lr_scheduler=cosine", "optimizer.lr=0.01", "lr_scheduler.eta_min=0.01"],
    ["lr_scheduler=cosine_per_step"],
    ["trainer.limit_train_batches=0.5", "+trainer.max_steps=3"],
    ["data=uci", "data.val_fraction=0.0"],
])
def test_the_edges_of_the_allowed_ranges_pass(overrides):
    load_run_config(compose_config(overrides))


def _uci_set(root, rows: list[list[float]], train: list[int], test: list[int]):
    d = root / "UCI" / "yacht"
    d.mkdir(parents=True)
    (d / "data.txt").write_text("\n".join(" ".join(str(v) for v in r) for r in rows) + "\n")
    (d / "index_features.txt").write_text("0\n1\n")
    (d / "index_target.txt").write_text("2\n")
    (d / "n_splits.txt").write_text("1\n")
    (d / "index_train_0.txt").write_text("\n".join(map(str, train)) + "\n")
    (d / "index_test_0.txt").write_text("\n".join(map(str, test)) + "\n")
    return d


def test_one_training_row_is_too_small_not_a_learning_rate_problem(tmp_path):
    from laplace_lab.data import UCIDataModule

    d = _uci_set(tmp_path, [[0.1, 0.2, 1.0], [0.3, 0.1, 2.0]], train=[0], test=[1])
    with pytest.raises(ValueError, match=rf"UCI set 'yacht' is too small: 1 training row\(s\) in "
                                         rf"{d / 'index_train_0.txt'} .*at least 2 rows"):
        UCIDataModule(name="yacht", split=0, data_dir=str(tmp_path))
    cfg = compose_config(["data=uci", f"paths.data_dir={tmp_path}", "logger=csv"])
    with pytest.raises(ValueError, match="is too small"):
        run(cfg, tmp_path / "run")


def test_constant_target_is_refused_and_two_rows_pass(tmp_path):
    from laplace_lab.data import UCIDataModule

    _uci_set(tmp_path / "a", [[0.1, 0.2, 1.0], [0.3, 0.1, 1.0], [0.5, 0.7, 2.0]], train=[0, 1], test=[2])
    with pytest.raises(ValueError, match="the target is constant over the 2 training rows"):
        UCIDataModule(name="yacht", split=0, data_dir=str(tmp_path / "a"), val_fraction=0.0)
    _uci_set(tmp_path / "b", [[0.1, 0.2, 1.0], [0.3, 0.1, 3.0], [0.5, 0.7, 2.0]], train=[0, 1], test=[2])
    dm = UCIDataModule(name="yacht", split=0, data_dir=str(tmp_path / "b"), val_fraction=0.0)
    assert len(dm.train_set) == 2
