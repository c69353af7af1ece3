"""augmentation/ group: validation of invalid combinations, model wrapping, the eta step, MNIST variants."""

import math

import pytest
import torch

from laplace_lab.config.load import load_run_config as validate_augmentation_config
from laplace_lab.data.transformed import transform_images
from laplace_lab.models import LeNet
from laplace_lab.models.augmentation import AugmentedModel
from laplace_lab.training.invariance_marglik import wrap_model

LEARNED = ["data=mnist", "model=lenet", "method=online_kron", "augmentation=learned", "predictive=map"]


def test_default_is_none_and_the_learned_preset_validates(compose_cfg):
    cfg = compose_cfg([])
    assert cfg.augmentation.mode == "none"
    validate_augmentation_config(cfg)
    validate_augmentation_config(compose_cfg(LEARNED))
    validate_augmentation_config(compose_cfg(["data=mnist", "model=lenet", "augmentation=fixed", "predictive=nn_mc"]))
    validate_augmentation_config(compose_cfg(["experiment=immer2022_invariance_cpu"]))
    validate_augmentation_config(compose_cfg(["experiment=immer2022_invariance"]))


@pytest.mark.parametrize("overrides, match", [
    (["augmentation.mode=sometimes"], "augmentation.mode='sometimes' is not supported"),
    (["marglik=posthoc"], "needs marglik=online"),
    (["curvature=ll_kron"], "subset_of_weights=all"),
    (["curvature.hessian_structure=full"], "hessian_structure in"),
    (["curvature.type=mc_fisher"], "curvature.type in"),
    (["prior=normgroups"], "prior.structure in"),  # (diagonal: kron rejects it first)
    (["augmentation.learnable=[]"], "non-empty augmentation.learnable"),
    (["augmentation.learnable=[zoom]"], "augmentation.learnable has unknown"),
    (["+augmentation.init.zoom=1"], "augmentation.init has unknown"),
    (["augmentation.lr=0"], "augmentation.lr must be > 0"),
    (["data=toy2d", "model=mlp"], "needs an image data set"),
    (["predictive=glm_probit"], "predictive.pred_type in"),
])
def test_invalid_combinations_are_rejected(compose_cfg, overrides, match):
    with pytest.raises(ValueError, match=match):
        validate_augmentation_config(compose_cfg(LEARNED + overrides))


def test_wrap_model(compose_cfg):
    net = LeNet((1, 28, 28), 10)
    assert wrap_model(validate_augmentation_config(compose_cfg([])).augmentation, net) is net
    fixed = wrap_model(validate_augmentation_config(compose_cfg(["data=mnist", "model=lenet", "augmentation=fixed",
                                                              "predictive=map"])).augmentation, net)
    assert isinstance(fixed, AugmentedModel) and not fixed.augmentation.learnable.any()
    assert fixed.augmentation.ranges()["rotation"] == pytest.approx(math.pi)
    learned = wrap_model(validate_augmentation_config(compose_cfg(LEARNED)).augmentation, net)
    assert learned.augmentation.learnable.all() and learned.augmentation.n_samples == 31


def test_mnist_variants_are_fixed_seed_and_differ():
    torch.manual_seed(0)
    X = torch.rand(5, 1, 28, 28)
    for kind in ("rotated_full", "rotated_partial", "translated"):
        a, b = transform_images(X, kind, train=True), transform_images(X, kind, train=True)
        assert torch.equal(a, b) and not torch.allclose(a, X)
        assert not torch.equal(a, transform_images(X, kind, train=False))
        assert a.min() >= 0 and a.max() <= 1
    assert transform_images(X, "none", True) is X
    with pytest.raises(ValueError, match="data.transform"):
        transform_images(X, "flipped", True)


@pytest.mark.slow
def test_learned_run_logs_eta_per_epoch_and_draws_the_figure(tmp_path, data_dir):
    """Three epochs of LeNet on 200 rotated MNIST images: eta moves, csv columns, figure (~40 s)."""
    import csv
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "laplace_lab.train", "data=mnist", "data.n_train_subset=200", "data.n_val=100",
           "data.transform=rotated_full", "data.ood=[]", "model=lenet", "method=online_kron", "augmentation=learned",
           "augmentation.n_samples=4", "marglik.n_steps=1", "trainer.max_epochs=3", "predictive=map",
           "evaluation=none", "logger=csv", f"paths.output_root={tmp_path}", f"paths.data_dir={data_dir}",
           "trainer.enable_progress_bar=false", "hydra.run.dir=" + str(tmp_path / "run")]
    subprocess.run(cmd, check=True, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True)
    logged = [r for r in csv.DictReader(open(tmp_path / "run" / "csv" / "metrics.csv")) if r["augmentation/rotation"]]
    rows = [r for r in logged if not r.get("marglik/best_log_marglik")]  # per epoch; the last row: final metrics
    assert len(rows) == 3 and len(logged) == 4
    rot = [float(r["augmentation/rotation"]) for r in rows]
    assert len(set(rot)) == 3 and all(math.isfinite(float(r["augmentation/log_marglik"])) for r in rows)
    assert (tmp_path / "run" / "figures" / "augmentation_eta.png").stat().st_size > 1000
    import json

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert math.isfinite(metrics["augmentation/log_marglik"]) and math.isfinite(metrics["marglik/best_log_marglik"])
    # early stopping restores the eta of the best-marglik epoch (snapshot before that epoch's eta step)
    assert metrics["augmentation/rotation"] in [pytest.approx(r) for r in [0.0, *rot]]


@pytest.mark.parametrize("overrides, match", [
    (["augmentation=fixed", "curvature.hessian_structure=full"], "with marglik=online needs"),
    (["augmentation=fixed", "marglik.fused=true", "curvature.type=ef"], "marglik.fused=false"),
    (["marglik.fused=true", "curvature.type=ef"], "marglik.fused=false"),
])
def test_the_prior_step_of_augmented_runs_needs_the_averaged_curvature(compose_cfg, overrides, match):
    with pytest.raises(ValueError, match=match):
        validate_augmentation_config(compose_cfg(LEARNED + overrides))


def test_online_marglik_prior_step_fits_the_averaged_model():
    """``OnlineMarglik``'s fit of an augmented model is the reduce KFAC of the eta step (the same
    marglik), of a plain network the engine's own fit."""
    from types import SimpleNamespace

    from torch import nn

    from laplace_lab.laplace import Laplace
    from laplace_lab.laplace import differentiable_marglik as dm
    from laplace_lab.models.augmentation import TRANSFORMS, AffineAugmentation
    from laplace_lab.training.online_marglik import fit_for_marglik

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    model = AugmentedModel(net, AffineAugmentation(4, {"rotation": 1.0}, TRANSFORMS)).double()
    X, y = torch.rand(5, 1, 8, 8, dtype=torch.float64), torch.randint(0, 3, (5,))
    model.frozen_eps = model.augmentation.sample_eps(5)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    fac = fit_for_marglik(la, SimpleNamespace(model=model, likelihood="classification"), [(X, y)])
    prior = torch.tensor([0.8], dtype=torch.float64)
    torch.testing.assert_close(la.log_marginal_likelihood(prior),
                               dm.log_marglik_from_factors(model, fac, prior), rtol=1e-10, atol=1e-8)
    la_net = Laplace(net, "classification", subset_of_weights="all", hessian_structure="kron")
    assert fit_for_marglik(la_net, SimpleNamespace(model=net, likelihood="classification"), [(X, y)]) is None
    assert la_net.fitted
