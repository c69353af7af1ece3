"""The Immer et al. 2021 images peer (``experiments/immer2021_images_peer_cut/peer/marglik_images_peer.py``): the
preset our side runs has the cut and the marglik settings the peer script gives laplace-torch's
``marglik_training``, and its side=ours rows come from a jobs CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from laplace_lab.config.load import load_run_config
from laplace_lab.reporting import peer_pairs
from tests.conftest import compose_config, load_script, write_jobs_csv

ROOT = Path(__file__).resolve().parents[2]
PEER = load_script(ROOT / "experiments" / "immer2021_images_peer_cut" / "peer" / "marglik_images_peer.py")


def test_peer_cut_preset_is_the_peer_scripts_recipe():
    cfg = compose_config(["experiment=immer2021_images_peer_cut"])
    load_run_config(cfg)
    OmegaConf.resolve(cfg)
    recipe, cut = PEER.RECIPE, PEER.CUT
    assert (cfg.data.n_train_subset, cfg.trainer.max_epochs) == (cut["n_train"], cut["epochs"])
    assert (cfg.data.batch_size, cfg.data.n_val, cfg.optimizer.lr) == (recipe["batch_size"], recipe["n_val"], recipe["lr"])
    # laplace-torch steps its scheduler after every batch: CosineAnnealingLR over epochs x batches
    assert cfg.lr_scheduler._target_.endswith("StepwiseCosine") and cfg.lr_scheduler.eta_min == recipe["eta_min"]
    assert (cfg.marglik.frequency, cfg.marglik.burnin, cfg.marglik.n_steps, cfg.marglik.lr_hyp) == (
        recipe["marglik_frequency"], recipe["n_epochs_burnin"], recipe["n_hypersteps"], recipe["lr_hyp"])
    assert cfg.marglik.early_stopping is True  # marglik_training returns the best-marglik network and prior
    assert cfg.prior.prior_precision == recipe["prior_prec_init"] and cfg.method_name == "online_kron"
    assert (cfg.curvature.hessian_structure, cfg.curvature.type, cfg.prior.structure) == ("kron", "ggn", "layerwise")
    sweep = yaml.safe_load((ROOT / "experiments" / "immer2021_images_peer_cut" / "preset.yaml").read_text())
    assert set(sweep["hydra"]["sweeper"]["params"]["model"].split(",")) == set(PEER.MODELS)


def _jobs_csv(path: Path) -> Path:
    rows = [
        {"job": "a", "data.name": "mnist", "model": "lenet", "method_name": "online_kron",
         "overrides": "data=mnist model=lenet seed=1 experiment=immer2021_images_peer_cut", "commit": "abc123",
         "dirty": "False", "wall_s": "90.5"},
        {"job": "b", "data.name": "fashion_mnist", "model": "mlp_500_300", "method_name": "online_kron",
         "overrides": "data=fashion_mnist model=mlp_500_300 seed=2 trainer.max_epochs=3 "
                      "experiment=immer2021_images_peer_cut", "commit": "abc123", "dirty": "False", "wall_s": "80"},
        {"job": "c", "data.name": "mnist", "model": "lenet", "method_name": "map_wd",
         "overrides": "data=mnist model=lenet seed=1 method=map_wd", "commit": "abc123", "dirty": "False", "wall_s": "1"},
    ]
    for i, row in enumerate(rows):
        row.update({m: str(0.1 * (i + 1)) for m in PEER.METRICS})
    return write_jobs_csv(path, "immer2021_images_peer_cut", rows)


def test_ours_peer_rows_from_a_jobs_csv(tmp_path):
    rows = PEER.ours_peer_rows(_jobs_csv(tmp_path / "jobs.csv"), n_train=5000, epochs=10)
    assert [(r["data"], r["model"], r["seed"], r["n_train"], r["epochs"]) for r in rows] == [
        ("mnist", "lenet", "1", 5000, 10), ("fashion_mnist", "mlp_500_300", "2", 5000, "3")]  # map_wd left out
    assert rows[0]["side"] == "ours" and rows[0]["commit"] == "abc123" and rows[0]["wall_s"] == "90.5"
    assert rows[0]["command"].startswith("python -m laplace_lab.train ") and rows[0]["test/la/nll"] == "0.1"


def test_add_ours_replaces_our_rows_and_keeps_theirs(tmp_path):
    out = tmp_path / "peer.csv"
    PEER.start_csv(out, "laplace-torch 0.3 (PyPI)", "python marglik_images_peer.py")
    theirs = {k: "" for k in PEER.FIELDS} | {"side": "theirs", "seed": 1, "commit": "laplace-torch 0.3 (PyPI)",
                                             "command": "x", "data": "mnist", "model": "lenet", "n_train": 5000,
                                             "epochs": 10, "n_test": 10000, "test/la/nll": 0.2}
    with out.open("a", newline="") as f:
        csv.DictWriter(f, PEER.FIELDS).writerow(theirs)
    jobs = _jobs_csv(tmp_path / "jobs.csv")
    PEER.add_ours(out, jobs, 5000, 10)
    PEER.add_ours(out, jobs, 5000, 10)  # again: replaced, not doubled
    table = peer_pairs.read_peer_csv(out)
    assert [r["side"] for r in table.rows] == ["theirs", "ours", "ours"]
    assert any("marglik_training" in c for c in table.comments)
    values = peer_pairs.side_values(table, {"data": "mnist", "model": "lenet"}, "test/la/nll", "test")
    assert values == {"ours": {1: pytest.approx(0.1)}, "theirs": {1: pytest.approx(0.2)}}
