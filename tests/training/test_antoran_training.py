"""Antoran et al. 2022 wired into training: the ``normgroups`` prior (module buffer <-> engine
groups, post-hoc and online marglik), ``marglik.evidence_point`` and the ``model.norm`` option."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.linear_mode import fit_linear_mode
from laplace_lab.laplace.normgroups import normgroups
from laplace_lab.models import MLP, LeNet
from laplace_lab.training.build import build
from laplace_lab.training.hyperparameters import initial_log_prior, write_prior
from laplace_lab.training.posthoc import fit_posthoc_laplace
from laplace_lab.training.predictors import laplace_predictor
from tests.conftest import run_config
from tests.training.marglik_helpers import TensorDataModule, fit_online

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("make", [lambda n: MLP((1, 8, 8), 3, [6, 5], norm=n), lambda n: LeNet((1, 28, 28), 3, norm=n)])
def test_norm_option(make):
    plain, normed = make("none"), make("batchnorm")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in plain.modules())
    bns = [m for m in normed.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns and all(m.training for m in normed.modules())
    assert all(float(b.running_mean.abs().sum()) == 0 for b in bns)  # the shape probe left no statistics
    x = torch.zeros(2, *((1, 8, 8) if isinstance(plain, MLP) else (1, 28, 28)))
    assert int(normgroups(normed, example_input=x).max()) == len(bns)  # one group per normalised layer
    assert int(normgroups(plain, example_input=x).max()) == 0
    with pytest.raises(ValueError, match=r"model.norm='layer'.*allowed: \['batchnorm', 'none'\]"):
        make("layer")


def test_default_norm_keeps_the_networks():
    """``norm: none`` builds exactly the networks of before (parameter names and shapes)."""
    lenet = LeNet((1, 28, 28), 10)
    assert [(n, tuple(p.shape)) for n, p in lenet.named_parameters()] == [
        ("0.weight", (6, 1, 5, 5)), ("0.bias", (6,)), ("3.weight", (16, 6, 5, 5)), ("3.bias", (16,)),
        ("7.weight", (120, 256)), ("7.bias", (120,)), ("9.weight", (84, 120)), ("9.bias", (84,)),
        ("11.weight", (10, 84)), ("11.bias", (10,))]
    assert [n for n, _ in MLP((2,), 2, [5]).named_parameters()] == ["1.weight", "1.bias", "3.weight", "3.bias"]


# ------------------------------------------------------------------------- buffer <-> engine
def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def test_normgroups_buffer_mapping():
    model = _bn_net()  # tensors: 0.w 0.b | 1.w 1.b | 3.w 3.b
    groups = torch.tensor([1, 1, 0, 0, 0, 0])
    buffer = torch.tensor([1.0, 3.0, 2.0, 4.0, 6.0, 8.0])
    params = list(model.parameters())
    log_p = initial_log_prior(buffer, model, params, "normgroups", groups=groups)
    torch.testing.assert_close(log_p.exp(), torch.tensor([5.0, 2.0]))  # group means
    new = write_prior(buffer, model, params, "normgroups", torch.tensor([0.5, 7.0]), groups=groups)
    torch.testing.assert_close(new, torch.tensor([7.0, 7.0, 0.5, 0.5, 0.5, 0.5]))
    # a subset (the last layer, group 0 only): the other tensors keep their values
    last = params[-2:]
    torch.testing.assert_close(write_prior(buffer, model, last, "normgroups", torch.tensor([9.0]),
                                           groups=torch.tensor([0, 0])),
                               torch.tensor([1.0, 3.0, 2.0, 4.0, 9.0, 9.0]))
    with pytest.raises(ValueError, match="normgroups"):
        initial_log_prior(buffer, model, params, "normgroups")


def test_online_marglik_normgroups_writes_group_values():
    torch.manual_seed(0)
    X = torch.randn(64, 3, dtype=torch.float64)
    y = torch.tanh(X @ torch.randn(3, 1, dtype=torch.float64)) + 0.1 * torch.randn(64, 1, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)).double()
    module, callback, _ = fit_online(model, TensorDataModule(X, y, batch_size=32), epochs=2,
                                     callback_kwargs={"prior_structure": "normgroups", "n_steps": 20,
                                                      "optimize_sigma": False})
    p = module.prior_precision
    assert p.shape == (6,) and callback.log_prior.shape == (2,)
    assert p[0] == p[1] and bool((p[2:] == p[2]).all())  # one value per group, written per tensor
    torch.testing.assert_close(p[[2, 0]].double(), callback.log_prior.detach().exp().float().double())
    assert abs(float(p[0] - p[2])) > 1e-3 and bool((p != 1.0).all())  # the groups moved apart
    logged = callback.history[-1]
    assert logged["marglik/prior_precision/0.weight"] == pytest.approx(float(p[0]))
    assert logged["marglik/prior_precision/3.bias"] == pytest.approx(float(p[5]))


# ------------------------------------------------------------------------------- post-hoc
POSTHOC = ["model.widths=[8,8]", "model.norm=batchnorm", "data.n_train=64", "curvature=full",
           "marglik.linear_mode.n_outer=3", "torch_num_threads=1", "predictive=glm_probit"]


def _posthoc(overrides):
    cfg = run_config(POSTHOC + overrides)
    datamodule, module = build(cfg)
    datamodule.setup("fit")
    with torch.no_grad():  # some BatchNorm statistics (the run's would come from training)
        module.model.train()
        module.model(next(iter(datamodule.train_dataloader()))[0])
        module.model.eval()
    return cfg, module, datamodule, *fit_posthoc_laplace(cfg, module, datamodule)


def test_posthoc_normgroups_and_linear_mode():
    cfg, module, dm, la_w, m_w = _posthoc(["prior=normgroups", "prior.prior_precision=2.0"])
    assert la_w.prior_structure == "normgroups" and la_w.prior_groups.tolist() == [1, 0, 0, 2, 0, 0, 0, 0]
    assert la_w.linear_offset is None and "laplace/linear_mode_rounds" not in m_w
    assert m_w["laplace/prior_precision/group1"] != pytest.approx(2.0)  # tuned by the evidence
    assert m_w["laplace/log_marglik"] == pytest.approx(float(la_w.log_marginal_likelihood()))

    cfg, module, dm, la, m = _posthoc(["prior=normgroups", "prior.prior_precision=2.0",
                                       "marglik.evidence_point=linear_mode"])
    assert la.linear_offset is not None and m["laplace/linear_mode_shift"] > 0
    assert m["laplace/log_marglik"] == pytest.approx(float(la.log_marginal_likelihood()))
    for metrics in (m_w, m):  # the recorded terms add up to the recorded evidence
        assert metrics["laplace/log_lik"] - 0.5 * (metrics["laplace/log_det_ratio"] + metrics["laplace/scatter"]) \
            == pytest.approx(metrics["laplace/log_marglik"], rel=1e-6)  # float32 terms
        assert metrics["laplace/log_det_ratio"] > 0 and metrics["laplace/scatter"] > 0
    # the same joint fit done by hand on the engine: identical precisions and mode
    ref = Laplace(module.model, "classification", subset_of_weights="all", hessian_structure="full",
                  prior_structure="normgroups", prior_precision=2.0, prior_groups=la.prior_groups)
    loader = dm.train_eval_dataloader()
    ref.fit(loader)
    fit_linear_mode(ref, list(loader), n_outer=3, tol=cfg.marglik.linear_mode.tol,
                    cg_tol=cfg.marglik.linear_mode.cg_tol, cg_max_iter=cfg.marglik.linear_mode.cg_max_iter,
                    max_newton=cfg.marglik.linear_mode.max_newton, newton_tol=cfg.marglik.linear_mode.newton_tol,
                    round_newton=cfg.marglik.linear_mode.round_newton,
                    solve_subset=cfg.marglik.linear_mode.solve_subset, seed=cfg.seed)
    torch.testing.assert_close(la.prior_precision, ref.prior_precision)
    torch.testing.assert_close(la.mean, ref.mean)
    # the evaluation's predictive is the linear model's at theta*: it differs from the weights'
    x = next(iter(dm.test_dataloader()))[0][:16]
    probs = laplace_predictor(la, cfg.predictive)(x)
    torch.testing.assert_close(probs, la(x, link_approx="probit"))
    la_w.prior_precision = la.prior_precision
    assert (probs - la_w(x, link_approx="probit")).abs().max() > 1e-4


def test_posthoc_linear_mode_fixed_prior():
    """``posthoc_prior: none``: theta* at the fixed prior, the precision stays."""
    _, _, _, la, m = _posthoc(["prior=scalar", "prior.prior_precision=3.0", "marglik.posthoc_prior=none",
                               "marglik.evidence_point=linear_mode"])
    assert m["laplace/prior_precision_mean"] == pytest.approx(3.0) and m["laplace/linear_mode_rounds"] == 0
    assert la.linear_offset.abs().max() > 0
