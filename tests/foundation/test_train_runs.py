"""Short end-to-end training runs (Lightning fast_dev_run) for every model with a fitting dataset."""

from __future__ import annotations

import json

import pytest

from laplace_lab.train import run
from tests.conftest import compose_config, run_config

# curvature=ll_kron: these runs check that each network and data set trains and evaluates; the
# root default's all-weights KFAC on the image networks took minutes per run on a shared CPU
FAST = ["trainer=debug", "logger=csv", "evaluation.max_test_batches=1", "evaluation.ood.n_generated=64",
        "evaluation.shift.rotation.angles=[0,90]", "evaluation.progress=false", "curvature=ll_kron"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["data=toy2d", "model=mlp"],
        ["data=sinusoid", "model=mlp"],
        ["data=sinusoid", "model=mlp", "likelihood=heteroscedastic_regression"],
        ["data=fake_data", "model=lenet"],
        ["data=fake_data", "model=resnet18", "model.width=8"],
        ["data=fake_data", "model=resnet18", "model.width=8", "model.norm=none"],
        ["data=fake_data", "model=wrn16_4", "model.widen_factor=1"],
        ["data=fake_data", "model=wrn16_4_nonorm", "model.widen_factor=1"],
    ],
    ids=lambda o: "-".join(x.split("=")[1] for x in o),
)
def test_fast_dev_run(overrides, tmp_path):
    metrics = run(compose_config(overrides + FAST), tmp_path)
    assert (tmp_path / "metrics.json").exists() and (tmp_path / "config_resolved.yaml").exists()
    assert all(v == v for v in metrics.values())  # no NaN


def test_real_data_runs(tmp_path, data_dir):
    # Loading and training on the real data (the Laplace part is tested on small data elsewhere).
    for overrides in (["data=mnist", "model=lenet"], ["data=uci", "data.name=yacht", "model=mlp"]):
        metrics = run(compose_config(overrides + FAST + [f"paths.data_dir={data_dir}", "method=map"]), tmp_path)
        assert metrics


def test_uci_reports_original_units(tmp_path, data_dir):
    cfg = compose_config(["data=uci", "data.name=yacht", "model=mlp", "trainer.max_epochs=5", "logger=csv",
                          "trainer.enable_progress_bar=false", f"paths.data_dir={data_dir}"])
    metrics = run(cfg, tmp_path)
    assert {"test/map/rmse", "test/map/ll"} <= set(metrics)
    # Yacht targets range over ~0-60 with std ~15: an RMSE in original units is >> the standardised one.
    assert 0.5 < metrics["test/map/rmse"] < 30


def _without_timings(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if "time" not in k}


def test_seed_zero_is_reproducible(tmp_path):
    cfg = compose_config(["seed=0", "trainer.max_epochs=2", "logger=csv", "trainer.enable_progress_bar=false",
                          "evaluation=none"])
    first = _without_timings(run(cfg, tmp_path / "a"))
    second = _without_timings(run(cfg, tmp_path / "b"))
    assert first == second
    other = _without_timings(run(compose_config(["seed=1", "trainer.max_epochs=2", "logger=csv",
                                                 "trainer.enable_progress_bar=false", "evaluation=none"]), tmp_path / "c"))
    assert other != first


def test_wandb_offline_and_csv(tmp_path):
    cfg = compose_config(["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.log_every_n_steps=1",
                          "trainer.enable_progress_bar=false", "logger=default", "logger.wandb.mode=offline",
                          "logger.wandb.enabled=true"])  # (data_recipe/toy2d.yaml logs CSV only)
    run(cfg, tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    csv = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "test/map/acc" in csv and "train/loss" in csv
    assert json.loads((tmp_path / "metrics.json").read_text())["test/map/acc"] >= 0


def test_map_cache_reuses_training(tmp_path):
    base = ["trainer.max_epochs=2", "logger=csv", "trainer.enable_progress_bar=false", "map_cache.enabled=true",
            f"map_cache.dir={tmp_path / 'cache'}", "evaluation.progress=false"]
    first = run(compose_config(base), tmp_path / "a")
    # prior.structure only shapes the post-hoc Laplace: the MAP network is shared
    second = run(compose_config(base + ["predictive=map", "curvature=diag", "prior=normgroups"]), tmp_path / "b")
    assert "map_cache/hit" not in first and second["map_cache/hit"] == 1.0
    assert second["test/map/nll"] == first["test/map/nll"]
    # a cache hit still reports the sweep objective (Optuna's): the cached network's validation NLL
    assert second["val/nll"] == pytest.approx(first["val/nll"], rel=1e-5)
    third = run(compose_config(base + ["seed=3"]), tmp_path / "c")
    assert "map_cache/hit" not in third


def test_map_grid_picks_the_best_validation_nll(tmp_path):
    cfg = compose_config(["method=map_grid", "map_grid=[0.01,1000.0]", "trainer.max_epochs=3", "logger=csv",
                          "trainer.enable_progress_bar=false", "evaluation=none"])
    metrics = run(cfg, tmp_path)
    grid = {0.01: metrics["grid/prior_0.01/val_nll"], 1000.0: metrics["grid/prior_1000/val_nll"]}
    assert metrics["hparams/prior_precision"] == pytest.approx(min(grid, key=grid.get))
    assert metrics["val/nll"] == pytest.approx(min(grid.values()))


def _refit_matches_plain_run(base, held_out, tmp_path):
    """Grid with refit, then a plain run with the chosen prior precision and ``held_out``=0 (same
    seed): the two MAP networks must be equal. Returns (refit datamodule, module, plain datamodule)."""
    import torch

    from laplace_lab.training.fit import train_map
    from laplace_lab.training.map_grid import train_map_grid

    cfg = run_config(base + ["map_grid=[0.01,100.0]", "map_grid_refit=true"])
    datamodule, module, _, metrics = train_map_grid(cfg, tmp_path / "grid", loggers=[])
    grid = {0.01: metrics["grid/prior_0.01/val_nll"], 100.0: metrics["grid/prior_100/val_nll"]}
    chosen = min(grid, key=grid.get)  # the grid's own value (the module's float32 copy rounds it)
    assert metrics["hparams/prior_precision"] == pytest.approx(chosen) and metrics["val/nll"] == pytest.approx(min(grid.values()))
    plain_dm, plain, _, _ = train_map(run_config(base + [f"prior.prior_precision={chosen}", f"{held_out}=0"]),
                                      tmp_path / "plain", loggers=[])
    assert len(datamodule.train_set) == len(plain_dm.train_set)
    for a, b in zip(module.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    return datamodule, module, plain_dm


def test_map_grid_refit_retrains_the_chosen_value_on_all_training_images(tmp_path):
    base = ["data=fake_data", "model=lenet", "trainer.max_epochs=2", "logger=csv", "trainer.enable_progress_bar=false",
            "evaluation=none", "marglik=off", "predictive=map"]
    datamodule, _, _ = _refit_matches_plain_run(base, "data.n_val", tmp_path)
    assert len(datamodule.train_set) == 128  # the 32 validation images are back in training


def test_map_grid_refit_regression_sigma_is_the_training_rmse(tmp_path, data_dir):
    import torch

    base = ["data=uci", "data.name=yacht", f"paths.data_dir={data_dir}", "model=mlp", "model.widths=[20]",
            "trainer.max_epochs=30", "logger=csv", "trainer.enable_progress_bar=false", "evaluation=none",
            "marglik=off", "predictive=map"]
    datamodule, module, _ = _refit_matches_plain_run(base, "data.val_fraction", tmp_path)
    x, y = next(iter(datamodule.train_eval_dataloader(batch_size=10_000)))
    assert len(x) == len(datamodule.train_set) == 277  # yacht split 0: 90 % of 308 rows, none held out
    with torch.no_grad():
        rmse = (module(x) - y.reshape(len(y), -1)).pow(2).mean().sqrt()
    assert float(module.sigma_noise) == pytest.approx(float(rmse), rel=1e-6)


def test_map_grid_without_refit_keeps_the_grid_network_and_its_validation_rmse(tmp_path):
    import torch

    from laplace_lab.training.map_grid import train_map_grid

    cfg = run_config(["data=sinusoid", "model=mlp", "model.widths=[20]", "trainer.max_epochs=30", "logger=csv",
                      "trainer.enable_progress_bar=false", "evaluation=none", "marglik=off", "predictive=map",
                      "map_grid=[0.01,100.0]"])
    datamodule, module, _, _ = train_map_grid(cfg, tmp_path, loggers=[])
    x, y = next(iter(datamodule.val_dataloader()))
    with torch.no_grad():
        rmse = (module(x) - y.reshape(len(y), -1)).pow(2).mean().sqrt()
    assert float(module.sigma_noise) == pytest.approx(float(rmse), rel=1e-6)


def test_map_cache_key_is_the_whole_config_less_run_only_keys():
    from laplace_lab.training import map_cache

    base = run_config(["map_cache.enabled=true"])
    same = run_config(["map_cache.enabled=true", "logger=csv", "torch_num_threads=2", "trainer.enable_progress_bar=false",
                           "curvature=diag", "predictive=map", "prior=normgroups", "experiment_name=other"])
    assert map_cache.cache_key(base) == map_cache.cache_key(same)
    # keys outside the old allow-list of training groups count too (here: the non-finite-loss policy)
    for changed in (["on_nonfinite_loss=skip"], ["seed=1"], ["model.widths=[20]"], ["trainer.gradient_clip_val=1.0"]):
        assert map_cache.cache_key(run_config(["map_cache.enabled=true", *changed])) != map_cache.cache_key(base), changed
    assert set(map_cache.key_contents(base)["code"]) == {"laplace_lab", "torch", "sources"}


def _uci_cache_run(data_root, cache, out):
    cfg = compose_config(["data=uci", f"paths.data_dir={data_root}", "trainer.max_epochs=1", "logger=csv",
                          "trainer.enable_progress_bar=false", "marglik=off", "predictive=map", "evaluation=none",
                          "map_cache.enabled=true", f"map_cache.dir={cache}"])
    return run(cfg, out)


def test_map_cache_is_invalidated_by_a_data_change(tmp_path, data_dir):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(data_dir / "UCI" / "yacht", root / "UCI" / "yacht")
    first = _uci_cache_run(root, tmp_path / "cache", tmp_path / "a")
    second = _uci_cache_run(root, tmp_path / "cache", tmp_path / "b")
    assert "map_cache/hit" not in first and second["map_cache/hit"] == 1.0
    data = root / "UCI" / "yacht" / "data.txt"
    lines = data.read_text().splitlines()
    lines[4] = " ".join([*lines[4].split()[:-1], "55.5"])  # one target value changed
    data.write_text("\n".join(lines) + "\n")
    third = _uci_cache_run(root, tmp_path / "cache", tmp_path / "c")
    assert "map_cache/hit" not in third
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 2 and len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_unwritable_map_cache_dir_warns_and_keeps_the_run(tmp_path, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder's parent should be")
    cfg = compose_config(["trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false", "evaluation=none",
                          "map_cache.enabled=true", f"map_cache.dir={blocker / 'cache'}"])
    metrics = run(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == metrics
    assert any("MAP cache: cannot write" in r.getMessage() for r in caplog.records)
