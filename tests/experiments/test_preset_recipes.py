"""The authors' recipes in the presets: per-method values resolve as documented, every
experiments/*/reference.yaml names its preset's metrics and rows, and the immer2021_uci peer
reference script runs (a few epochs on one split)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from laplace_lab.config.load import load_run_config
from laplace_lab.config.store import if_equal
from laplace_lab.reporting.results_summary import reads_peer_csv
from tests.conftest import CONF_DIR, compose_config, load_script, run_config

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_FILES = sorted((ROOT / "experiments").glob("*/reference*.yaml"))


def resolved(overrides: list[str]):
    cfg = compose_config(overrides)
    load_run_config(cfg)
    OmegaConf.resolve(cfg)
    return cfg


def test_if_equal_resolver():
    assert if_equal("map_grid", "map_grid", 0.1, 0.0) == 0.1
    assert if_equal("online_full", "map_grid", 0.1, 0.0) == 0.0
    assert list(if_equal("a", "a", [1, 2], None)) == [1, 2]
    assert if_equal("b", "a", [1, 2], None) is None


def test_immer2021_uci_grid_and_validation_split_only_for_map_grid():
    online = resolved(["experiment=immer2021_uci", "method=online_full"])
    assert online.data.val_fraction == 0.0 and online.map_grid is None
    assert (online.model.activation, online.trainer.max_epochs, online.marglik.frequency, online.marglik.burnin,
            online.marglik.n_steps) == ("tanh", 1000, 50, 100, 50)
    grid = resolved(["experiment=immer2021_uci", "method=map_grid"])
    assert grid.data.val_fraction == 0.1
    assert list(grid.map_grid) == [10.0 ** k for k in range(-4, 5)]
    # the authors' MAP-CV retrains the chosen value on all training rows; online marglik has no grid
    assert grid.map_grid_refit is True and online.map_grid_refit is False
    # a grid point (train.py sets map_grid=None on a copy) keeps its validation split
    point = compose_config(["experiment=immer2021_uci", "method=map_grid"]).copy()
    point.map_grid = None
    assert point.data.val_fraction == 0.1


def test_immer2021_images_is_the_authors_recipe():
    """runame/laplace-redux marglik_training: 60000 images, delta 30 = 5e-4 x 60000, 250 epochs,
    Adam 1e-3 with a per-batch cosine to 1e-6, F=1, K=100, B=0, lr_hyp 1; only map_grid holds
    images out; jobs resume from their last epoch (a CPU sweep takes several launches)."""
    for method in ("online_kron", "map_wd", "map_grid"):
        cfg = resolved(["experiment=immer2021_images", f"method={method}"])
        assert cfg.data.n_val == (5000 if method == "map_grid" else 0), method
        assert cfg.prior.prior_precision == 30.0 and cfg.trainer.max_epochs == 250 and cfg.data.batch_size == 128
        assert cfg.lr_scheduler._target_.endswith("StepwiseCosine") and cfg.lr_scheduler.eta_min == 1e-6
        assert cfg.optimizer.lr == 1e-3
        assert (cfg.checkpoint.enabled, cfg.checkpoint.resume_from) == (True, "last")
    online = resolved(["experiment=immer2021_images", "method=online_kron"])
    assert (online.marglik.frequency, online.marglik.n_steps, online.marglik.burnin, online.marglik.lr_hyp,
            online.marglik.early_stopping) == (1, 100, 0, 1.0, True)


def test_redux_table2_is_the_authors_recipe():
    """Laplace Redux Table 2 (runame/laplace-redux run_onmarglik_fmnist.py, fmnist_marglik.yaml, uq.py):
    LeNet on all 60k FashionMNIST images, delta 30, 250 epochs, Adam 1e-3 with a per-step cosine to
    1e-6, F=1, K=100, B=0, lr_hyp 1; all-weights GGN of the row's structure; MC predictive with 100
    samples on the authors' 8000-image test split; the three structures x seeds 0-2."""
    structures = {"online_diag": "diag", "online_kron": "kron", "online_full": "full"}
    for method, structure in structures.items():
        cfg = resolved(["experiment=redux_table2", f"method={method}"])
        assert (cfg.data.name, cfg.data.n_val, cfg.data.test_holdout, cfg.data.batch_size) == ("fashion_mnist", 0, 2000, 128)
        assert cfg.model._target_.endswith("LeNet") and cfg.prior.prior_precision == 30.0
        assert (cfg.trainer.max_epochs, cfg.optimizer.lr, cfg.lr_scheduler.eta_min) == (250, 1e-3, 1e-6)
        assert cfg.lr_scheduler._target_.endswith("StepwiseCosine")
        assert (cfg.marglik.mode, cfg.marglik.frequency, cfg.marglik.n_steps, cfg.marglik.burnin, cfg.marglik.lr_hyp,
                cfg.marglik.early_stopping) == ("online", 1, 100, 0, 1.0, True)
        assert (cfg.curvature.subset_of_weights, cfg.curvature.hessian_structure, cfg.curvature.type) == (
            "all", structure, "ggn"), method
        assert (cfg.prior.structure, cfg.method_name) == ("layerwise", method)
        assert cfg.trainer.accelerator == ("gpu" if structure == "full" else "auto"), method  # FULL: 15.8 GB P x P
        assert (cfg.predictive.pred_type, cfg.predictive.link_approx, cfg.predictive.n_samples) == ("glm", "mc", 100)
    sweep = yaml.safe_load((CONF_DIR.parent / "experiments" / "redux_table2" / "preset.yaml").read_text())["hydra"]["sweeper"]["params"]
    assert (sweep["method"], sweep["seed"]) == ("online_diag,online_kron,online_full", "0,1,2")


def test_sinusoid_trains_the_map_without_prior():
    cfg = resolved(["experiment=sinusoid"])
    assert cfg.prior_in_map_loss is False and cfg.marglik.n_steps == 1000


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[f"{p.parent.name}/{p.name}" for p in REFERENCE_FILES])
def test_reference_file_matches_its_preset(path):
    ref = yaml.safe_load(path.read_text())
    presets = [ref["preset"]] if isinstance(ref["preset"], str) else ref["preset"]
    for name in presets:
        assert (CONF_DIR.parent / "experiments" / name / "preset.yaml").is_file(), f"{path}: preset {name!r} does not exist"
    aggregates = [compose_config([f"experiment={name}"]).aggregate for name in presets]
    metrics = set.intersection(*(set(a.metrics) for a in aggregates))  # every preset of the file has them
    group_by = set.intersection(*(set(a.group_by) for a in aggregates))
    ids = [r["id"] for r in ref["references"]]
    assert len(ids) == len(set(ids)), f"{path}: duplicate ids"
    for r in ref["references"]:
        assert r.get("source"), f"{path}:{r['id']} has no source"
        if reads_peer_csv(r):  # judged on its own CSV (laplace_lab.reporting.reference validates it), not on the table
            continue
        sides = [r] if r["kind"] in ("value", "paper") else [r["lhs"], r["rhs"]]
        if r["kind"] == "value":
            assert isinstance(r["value"], (int, float)) and r["tolerance"] >= 0, r["id"]
        elif r["kind"] == "claim":
            assert r["op"] in ("<", "<=", ">", ">=") and r.get("claim"), r["id"]
        for side in sides:
            if r.get("not_run_reason") and side["metric"] not in metrics:
                continue  # a paper metric no job computes here, kept with the reason
            assert side["metric"] in metrics, f"{path}:{r['id']}: {side['metric']} not in the preset's metrics"
            assert set(side["row"]) <= group_by, f"{path}:{r['id']}: row keys {set(side['row'])} not in {group_by}"


def _load_peer_script():
    return load_script(ROOT / "experiments" / "immer2021_uci" / "laplace_torch_reference.py")


def test_peer_reference_script_runs_one_split(data_dir):
    peer = _load_peer_script()
    assert peer.parse_splits("0-2") == [0, 1, 2] and peer.parse_splits("1,4") == [1, 4]
    args = SimpleNamespace(lr=1e-2, epochs=3, lr_hyp=0.1, burnin=1, hyper_steps=2, frequency=1, dtype="float32")
    row = peer.run_one("yacht", 0, 0, str(data_dir), args)
    assert set(row) == set(peer.FIELDS) and row["dtype"] == "float32" and row["error"] == ""
    assert all(math.isfinite(row[k]) for k in ("test_la_ll", "test_map_ll", "sigma_noise", "prior_precision_mean"))
    failed = peer.failed_row("naval-propulsion-plant", 0, 0, args, RuntimeError("cholesky failed\nmore"))
    assert set(failed) == set(peer.FIELDS) and failed["error"] == "RuntimeError: cholesky failed"
    text = peer.summary([{k: str(v) for k, v in r.items()} for r in (row, failed)])
    assert "yacht | float32 | 1 | 0 |" in text and "metric: test/la/ll" in text
    assert "naval-propulsion-plant | float32 | 0 | 1 | -" in text and "peer_laplace_torch_naval" not in text


def test_adversarial_reuses_the_redux_map_networks():
    from laplace_lab.training.map_cache import cache_key
    from tests.conftest import run_config

    for seed in (0, 2):
        redux = run_config(["experiment=redux_mnist", "method=la", f"seed={seed}"])
        adversarial = run_config(["experiment=adversarial_mnist", "method=diag", f"seed={seed}"])
        assert cache_key(redux) == cache_key(adversarial)
    assert cache_key(redux) != cache_key(run_config(["experiment=redux_mnist", "seed=2", "prior.prior_precision=1"]))


def test_mola_members_follow_the_redux_recipe():
    """The MoLA presets train every member as redux_mnist (prior 30, all 60k images, batch 128, cosine);
    MNIST member 0 of seed s is redux_mnist's network of seed s (same MAP cache key)."""
    from laplace_lab.training.map_cache import cache_key

    for preset, epochs in (("eschenhagen2021_mnist", 100), ("eschenhagen2021_mnist_cpu", 10)):
        cfg = resolved([f"experiment={preset}"])
        assert (cfg.prior.prior_precision, cfg.data.n_val, cfg.data.batch_size, cfg.trainer.max_epochs) == (
            30.0, 0, 128, epochs), preset
        assert cfg.lr_scheduler._target_.endswith("CosineAnnealingLR") and cfg.optimizer.lr == 1e-3, preset
    for seed in (0, 3):
        mola = run_config(["experiment=eschenhagen2021_mnist", "data=mnist", f"seed={seed}"])
        redux = run_config(["experiment=redux_mnist", "method=la", f"seed={seed}"])
        assert cache_key(mola) == cache_key(redux)


@pytest.mark.slow  # ~20 s: eigendecompositions of the 3073 x 3073 input factor of 3 x 32 x 32 fake images
def test_images_peer_check_matches_laplace_torch(tmp_path):
    """experiments/immer2021_images_peer_cut/laplace_torch_images_check.py on a small finished online_kron job
    (fake images): our final Laplace and laplace-torch's KronLaplace agree."""
    from laplace_lab.train import run
    from tests.conftest import compose_config

    check = load_script(ROOT / "experiments" / "immer2021_images_peer_cut" / "laplace_torch_images_check.py")
    job = tmp_path / "job"
    run(compose_config(["data=fake_data", "model=mlp", "model.widths=[16]", "method=online_kron", "trainer.max_epochs=2",
                        "marglik.n_steps=5", "checkpoint.enabled=true", "logger=csv", "evaluation=none",
                        "trainer.enable_progress_bar=false"]), job)
    out = check.compare(job)
    ours, peer = out["log_marglik"]
    assert math.isfinite(ours) and abs(ours - peer) <= 1e-3 * abs(peer)
    p_ours, p_peer, p_map = out["probs"]
    assert p_ours.shape == p_map.shape == (len(out["labels"]), 10)
    assert torch.allclose(p_ours, p_peer, atol=1e-4)
    assert not torch.allclose(p_ours, p_map, atol=1e-3)  # the Laplace predictive is not the plug-in one
    only = check.compare(job, predictive=False)  # --marglik-only: the same two evidences, no predictive
    assert set(only) == {"prior", "log_marglik"} and only["log_marglik"] == pytest.approx(out["log_marglik"], rel=1e-6)
