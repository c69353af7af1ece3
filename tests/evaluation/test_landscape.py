"""evaluation.landscape: slices of the loss around the MAP beside the Laplace Gaussian.

On a model linear in its weights with a Gaussian likelihood the posterior is exactly Gaussian, so
at the exact MAP the slice of exp(-loss) is the full-GGN Laplace Gaussian at every grid point (to
float64 round-off); kron and diag give the Gaussian of their own (dense) precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import laplace_lab.train as train_mod
import laplace_lab.training.build as build_mod
from laplace_lab.evaluation.landscape import (
    SliceLoss,
    _head_module,
    compute_landscape,
    filter_normalized_direction,
    landscape_directions,
)
from laplace_lab.evaluation.options import LandscapeConfig, check_landscape_run, evaluation_config
from laplace_lab.laplace import Laplace

SIGMA, T, DELTA = 0.3, 1.3, 0.7


class TwoLinear(nn.Module):
    """``f = A x + B tanh(W x)`` with ``W`` frozen: linear in its trainable weights, two layers (so
    the last-layer shortcut does not apply and kron / diag differ from the full GGN)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.w = nn.Linear(3, 4).requires_grad_(False)
        self.b = nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.a(x) + self.b(torch.tanh(self.w(x)))


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = X @ torch.randn(3, 2, generator=g, dtype=torch.float64) + 0.1 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return TensorDataset(X, y)


def _exact_map(model: nn.Module, data: TensorDataset) -> None:
    """Set the trainable weights to the exact minimiser of ``|f - y|^2 / (2 sigma^2 T) + delta |theta|^2 / 2``
    (quadratic: one Newton step with the dense float64 Hessian)."""
    X, y = data.tensors
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    theta = torch.cat([p.detach().reshape(-1) for _, p in named])

    def energy(t):
        parts = dict(zip([n for n, _ in named], (s.reshape(p.shape) for s, (_, p) in
                                                 zip(t.split([p.numel() for _, p in named]), named))))
        f = torch.func.functional_call(model, parts, (X,))
        return 0.5 * (f - y).square().sum() / (SIGMA**2 * T) + 0.5 * DELTA * t.square().sum()

    theta = theta - torch.linalg.solve(torch.func.hessian(energy)(theta), torch.func.grad(energy)(theta))
    with torch.no_grad():
        for p, s in zip([p for _, p in named], theta.split([p.numel() for _, p in named])):
            p.copy_(s.reshape(p.shape))


def _fitted(model, data, structure, subset="all"):
    la = Laplace(model, "regression", subset_of_weights=subset, hessian_structure=structure,
                 prior_precision=DELTA, sigma_noise=SIGMA, temperature=T)
    la.fit(DataLoader(data, batch_size=16))
    return la


def _cfg(**kw):
    return LandscapeConfig(**{"enabled": True, "grid_points": 5, "grid_points_1d": 7, "n_train": None, "n_test": None, "extent": 2.0,
                              "n_directions": 3, **kw})


@pytest.fixture(scope="module")
def linear_setup():
    torch.manual_seed(0)
    model = TwoLinear().double()
    data = _data()
    _exact_map(model, data)
    return model, data


def _all_grids(ls):
    return [*ls.one_d, ls.two_d, *ls.post_one_d, ls.post_two_d]


@pytest.mark.parametrize("structure,directions", [("full", "random"), ("full", "eigen"), ("lowrank", "eigen")])
def test_exp_loss_slice_is_the_laplace_gaussian_on_a_linear_model(linear_setup, structure, directions):
    model, data = linear_setup
    la = _fitted(model, data, structure)
    ls = compute_landscape(la, data, data, _cfg(directions=directions))
    assert not ls.energy_map == 0
    assert ls.energy_map == pytest.approx(float(-la.log_likelihood + 0.5 * la.scatter), rel=1e-12)
    for g in _all_grids(ls):
        delta, log_gauss = g.values["delta"], g.values["log_gauss"]
        assert np.abs(delta).max() > 1.0  # the grids reach where the two could differ
        np.testing.assert_allclose(-delta, log_gauss, rtol=0, atol=1e-10 * max(1.0, np.abs(delta).max()))
        np.testing.assert_allclose(np.exp(-delta), np.exp(log_gauss), rtol=1e-10, atol=1e-14)
    assert ls.total_variation() < 1e-10
    np.testing.assert_allclose(ls.curvature_ratio, 1.0, rtol=1e-9)
    np.testing.assert_allclose(ls.offset_std, 0.0, atol=1e-9)


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_kron_and_diag_draw_the_gaussian_of_their_own_precision(linear_setup, structure):
    model, data = linear_setup
    la = _fitted(model, data, structure)
    cfg = _cfg(directions="random")
    ls = compute_landscape(la, data, data, cfg)
    D, _ = landscape_directions(la, cfg)
    P = la.structure.dense_precision(la.H_factor, la.structure_prior).double()
    Q = D.double() @ P @ D.double().T
    for i, g in enumerate(ls.post_one_d):
        a = g.axes[0]
        np.testing.assert_allclose(g.values["log_gauss"], -0.5 * float(Q[i, i]) * a**2, rtol=1e-12, atol=1e-12)
    A, B = np.meshgrid(*ls.post_two_d.axes, indexing="ij")
    ref = -0.5 * (float(Q[0, 0]) * A**2 + 2 * float(Q[0, 1]) * A * B + float(Q[1, 1]) * B**2)
    np.testing.assert_allclose(ls.post_two_d.values["log_gauss"], ref, rtol=1e-12, atol=1e-12)
    # ... which is not the exact posterior's: the structure's approximation shows in the difference
    assert np.abs(ls.post_two_d.values["delta"] + ls.post_two_d.values["log_gauss"]).max() > 1e-3


class Shifted(nn.Module):
    """A last Linear whose output is not the model's output (an offset added after it)."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x) + 0.0


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_last_layer_shortcut_matches_the_full_forward(likelihood):
    """The last-layer Laplace's cached inputs give the loss and the metric of the model's own forward."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    X, y = _data().tensors
    if likelihood == "classification":
        y = (y[:, 0] > 0).long()
    la = Laplace(model, likelihood, subset_of_weights="last_layer", hessian_structure="full", prior_precision=DELTA)
    la.fit(DataLoader(TensorDataset(X, y), batch_size=16))
    batches = [(X[:25], y[:25]), (X[25:], y[25:])]
    fast, slow = SliceLoss(la, batches, batches, "cpu"), SliceLoss(la, batches, batches, "cpu", shortcut=False)
    assert fast.head and not slow.head
    for scale in (0.0, 0.3, 2.0):
        w = scale * torch.randn(la.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        assert fast.energy(w) == pytest.approx(slow.energy(w), rel=1e-12)
        assert fast.metric(w) == pytest.approx(slow.metric(w), rel=1e-12)
    assert _head_module(model, la.entries, X) is model[2]
    assert _head_module(Shifted(model), la.entries, X) is None  # the shortcut would drop the offset


def test_filter_normalisation_per_filter_norms():
    """Li et al. 2018: each filter of a direction (a conv output channel, a linear output unit) has
    the norm of the weights' filter; 1-D tensors are zeroed, or equal the weights with biases=weights."""
    torch.manual_seed(0)
    conv, lin = nn.Conv2d(3, 5, 3), nn.Linear(7, 4)
    params = [conv.weight, conv.bias, lin.weight, lin.bias]
    d = filter_normalized_direction(params, torch.Generator().manual_seed(0))
    parts = d.split([p.numel() for p in params])
    for p, part in zip(params, parts):
        if p.ndim == 1:
            assert torch.equal(part, torch.zeros_like(part))
            continue
        rows, w = part.reshape(p.shape[0], -1), p.detach().reshape(p.shape[0], -1)
        torch.testing.assert_close(rows.norm(dim=1), w.norm(dim=1), rtol=1e-6, atol=0)
        assert not torch.allclose(rows, w)  # a random direction, not the weights
    d2 = filter_normalized_direction(params, torch.Generator().manual_seed(0), biases="weights")
    parts2 = d2.split([p.numel() for p in params])
    assert torch.equal(parts2[1], conv.bias.detach()) and torch.equal(parts2[3], lin.bias.detach())
    torch.testing.assert_close(parts2[0], parts[0])


def test_random_directions_over_biases_only_need_biases_weights():
    model = nn.Sequential(nn.Linear(3, 2)).double()
    model[0].weight.requires_grad_(False)
    data = _data()
    la = _fitted(model, data, "full")
    with pytest.raises(ValueError, match=r"evaluation\.landscape\.biases='zero' leaves every random direction zero"):
        landscape_directions(la, _cfg())
    D, _ = landscape_directions(la, _cfg(biases="weights"))
    torch.testing.assert_close(D[0], model[0].bias.detach())


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"landscape": {"grid_points": 0}},
         r"evaluation\.landscape\.grid_points must be >= 3; got 0 \(allowed: integers in \[3, inf\)\)"),
        ({"landscape": {"grid_points_1d": 2}}, r"evaluation\.landscape\.grid_points_1d must be >= 3; got 2"),
        ({"landscape": {"extent": -1.0}},
         r"evaluation\.landscape\.extent must be > 0; got -1.0 \(allowed: numbers in \(0, inf\)\)"),
        ({"landscape": {"directions": "pca"}},
         r"evaluation\.landscape\.directions='pca' is not supported; allowed: \['random', 'eigen'\]"),
        ({"landscape": {"n_directions": 1}}, r"evaluation\.landscape\.n_directions must be >= 2; got 1"),
        ({"landscape": {"n_train": 0}}, r"evaluation\.landscape\.n_train must be >= 1 or null; got 0"),
        ({"landscape": {"biases": "keep"}}, r"evaluation\.landscape\.biases='keep' is not supported"),
    ],
)
def test_bad_options_name_the_option(cfg, match):
    with pytest.raises(ValueError, match=match):
        evaluation_config(cfg)


def test_landscape_needs_the_evaluation_on():
    cfg = evaluation_config({"enabled": False, "landscape": {"enabled": True}})
    with pytest.raises(ValueError, match=r"evaluation\.landscape\.enabled=true needs evaluation\.enabled=true"):
        check_landscape_run(cfg, "full", True)


def test_eigen_directions_need_a_structure_with_eigenvectors():
    cfg = evaluation_config({"landscape": {"enabled": True, "directions": "eigen"}})
    for structure in ("full", "kron", "lowrank"):
        check_landscape_run(cfg, structure, True)
    with pytest.raises(ValueError, match=r"evaluation\.landscape\.directions='eigen' needs a curvature\.hessian_structure "
                                         r"with eigenvectors; allowed: \['full', 'kron', 'lowrank'\]; got 'diag'"):
        check_landscape_run(cfg, "diag", True)
    with pytest.raises(ValueError, match=r"evaluation\.landscape\.enabled=true needs a post-hoc Laplace"):
        check_landscape_run(cfg, "full", False)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["evaluation.landscape.enabled=true", "evaluation.landscape.grid_points=0"],
         r"evaluation\.landscape\.grid_points must be >= 3; got 0"),
        (["evaluation.landscape.enabled=true", "evaluation.landscape.extent=-0.5"],
         r"evaluation\.landscape\.extent must be > 0; got -0.5"),
        (["evaluation.enabled=false", "evaluation.landscape.enabled=true"],
         r"evaluation\.landscape\.enabled=true needs evaluation\.enabled=true"),
        (["evaluation.landscape.enabled=true", "evaluation.landscape.directions=eigen", "curvature=ll_diag"],
         r"evaluation\.landscape\.directions='eigen' needs a curvature\.hessian_structure with eigenvectors"),
        (["evaluation.landscape.enabled=true", "method=map"], r"evaluation\.landscape\.enabled=true needs a post-hoc"),
    ],
)
def test_bad_options_fail_before_training(overrides, match, compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "instantiate", lambda *a, **k: pytest.fail("data or model built before the error"))
    with pytest.raises(ValueError, match=match):
        train_mod.run(compose_cfg([*overrides, "logger=csv"]), tmp_path)


def test_run_evaluation_draws_and_logs_the_landscape(tmp_path, image_data, image_setup):
    """The switch on: 1-D, 2-D and likelihood-vs-Gaussian figures in out_dir/figures and as wandb
    images, the grids as tables, the scalars, the HTML page; the cost in the log line."""
    from eval_helpers import read_wandb_keys
    from pytorch_lightning.loggers import WandbLogger

    from laplace_lab.evaluation import EvalData, EvaluationPlan, LandscapeInputs
    from laplace_lab.evaluation.runner import run_evaluation

    train, test = image_data
    model, predictors, test_loader, _ = image_setup
    la = Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="kron",
                 prior_precision=1.0)
    la.fit(DataLoader(train, batch_size=64))
    cfg = {"progress": False, "ood": {"enabled": False}, "shift": {"rotation": {"enabled": False}},
           "landscape": {"enabled": True, "grid_points": 5, "grid_points_1d": 5, "n_train": 100, "n_test": 50, "html": True}}
    wandb_logger = WandbLogger(save_dir=str(tmp_path), offline=True, mode="offline", project="laplace-lab-test")
    out = tmp_path / "out"
    plan = EvaluationPlan(evaluation_config(cfg), "classification", predictors,
                          EvalData(test_loader, dataset="toy_images"), landscape=LandscapeInputs(la, train, test),
                          out_dir=out)
    metrics = run_evaluation(plan, logger=wandb_logger)
    run_dir = wandb_logger.experiment.dir
    wandb_logger.experiment.finish()
    keys = {"landscape/map/loss", "landscape/map/acc", "landscape/la/tv", "landscape/d1/la/curvature_ratio",
            "landscape/d2/la/offset_std"}
    assert keys <= set(metrics) and 0 <= metrics["landscape/la/tv"] <= 1
    figures = ["landscape_1d", "landscape_2d", "landscape_posterior"]
    for name in figures:
        path = out / "figures" / f"{name}.png"
        assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000, name
    page = (out / "figures" / "landscape.html").read_text()
    assert "const DATA = [" in page and "toy_images: last-layer kron Laplace (GGN)" in page
    import pandas as pd

    two_d = pd.read_csv(out / "tables" / "landscape_2d.csv")
    assert len(two_d) == 2 * 5 * 5 and {"grid", "a1", "a2", "loss", "delta", "log_gauss", "metric"} <= set(two_d)
    wandb_keys = read_wandb_keys(run_dir.rsplit("/files", 1)[0])
    assert {f"figures/{n}" for n in figures} | keys <= wandb_keys


def test_landscape_off_or_without_inputs_is_skipped(tmp_path, image_setup):
    from laplace_lab.evaluation import EvalData, EvaluationPlan
    from laplace_lab.evaluation.runner import run_evaluation

    model, predictors, test_loader, _ = image_setup
    cfg = {"progress": False, "ood": {"enabled": False}, "shift": {"rotation": {"enabled": False}}}
    run_evaluation(EvaluationPlan(evaluation_config(cfg), "classification", predictors, EvalData(test_loader),
                                  out_dir=tmp_path))
    import json

    assert "landscape" in json.loads((tmp_path / "eval_report.json").read_text())["skipped"]
    on = evaluation_config({**cfg, "landscape": {"enabled": True}})
    run_evaluation(EvaluationPlan(on, "classification", predictors, EvalData(test_loader), out_dir=tmp_path / "on"))
    skipped = json.loads((tmp_path / "on" / "eval_report.json").read_text())["skipped"]["landscape"]
    assert "the evaluation plan's landscape" in skipped


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("subset,structure,directions", [("last_layer", "kron", "random"), ("all", "full", "random")])
def test_landscape_on_cuda_matches_the_cpu(linear_setup, subset, structure, directions):
    """The same slices on the GPU as on the CPU: a Sequential's last layer (the cached-inputs
    shortcut) and the two-layer linear model (the general forward). Random directions: with two
    regression outputs the Kron eigenvalues come in equal pairs (``G = N I``), so an eigenbasis is
    not unique and CPU and CUDA ``eigh`` pick different ones (seen on an H200)."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double() if subset == "last_layer" \
        else linear_setup[0]
    data = linear_setup[1]
    on = {}
    for device in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(device)
        la = _fitted(m, TensorDataset(*(t.to(device) for t in data.tensors)), structure, subset)
        on[device] = compute_landscape(la, data, data, _cfg(directions=directions))
    for g_cpu, g_gpu in zip(_all_grids(on["cpu"]), _all_grids(on["cuda"])):
        for key in ("delta", "log_gauss", "loss"):
            np.testing.assert_allclose(g_gpu.values[key], g_cpu.values[key], rtol=1e-7, atol=1e-7)
