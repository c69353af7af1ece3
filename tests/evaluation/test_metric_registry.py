"""``evaluation.metric_registry``: one declaration per metric, read by the run's metrics, the
noise estimates, the console summary, model selection, the figures' labels and the sweep table.

The dummy metric below is declared here alone (``registered``) and appears everywhere a metric
appears, without a change to any other file."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from laplace_lab.evaluation import EvalData, EvaluationPlan, run_evaluation
from laplace_lab.evaluation import metric_registry as R
from laplace_lab.evaluation import metrics as M
from laplace_lab.evaluation.options import evaluation_config
from laplace_lab.evaluation.summary import format_summary
from laplace_lab.reporting import model_selection, tables
from tests.reporting.test_tables import make_job


def _top2_hits(probs, y):
    """Per point: the label is among the two most probable classes, ``[N]`` float64."""
    return (probs.topk(2, -1).indices == y[:, None]).any(-1).double()


TOP2 = R.Metric("top2", "classification", "top-2 accuracy", R.HIGHER,
                lambda probs, y, n_bins: _top2_hits(probs, y).mean().item(), tolerance=0.001,
                noise="paired", per_point=_top2_hits)
SMALL = {"n_bins": 10, "progress": False, "ood": {"enabled": False}, "shift": {"rotation": {"angles": [0, 90]}},
         "reliability_diagram": False}


def test_a_metric_declared_in_one_place_is_in_the_run_the_summary_and_the_sweep_table(tmp_path, image_setup):
    model, predictors, test_loader, ood_loaders = image_setup
    with R.registered(TOP2):
        plan = EvaluationPlan(evaluation_config(SMALL), "classification", predictors,
                              EvalData(test_loader, ood_loaders), attack_model=model, out_dir=tmp_path / "out")
        metrics = run_evaluation(plan)
        summary = format_summary(metrics)
        selection = model_selection.validate_spec({"score": "laplace/log_marglik", "candidates": ["model"],
                                                   "within": ["seed"], "targets": ["test/la/top2"]})
    # the run: every labelled section computes it, its noise is estimated, the CSV tables have its column
    x, y = test_loader.dataset.tensors
    assert metrics["test/map/top2"] == pytest.approx(_top2_hits(predictors["map"](x), y).mean().item())
    assert {"shift/rot_90/la/top2", "noise/test/top2"} <= set(metrics)
    assert "test/map/top2" in json.loads((tmp_path / "out" / "eval_metrics.json").read_text())
    with open(tmp_path / "out" / "tables" / "shift_rotation.csv") as f:
        assert next(csv.reader(f)) == ["predictor", "angle", "acc", "nll", "brier", "ece", "mce", "conf", "entropy",
                                       "top2"]
    # the console summary judges it by its declared tolerance and direction
    assert "test top-2 accuracy" in summary and "top-2 accuracy" in summary.splitlines()[-3]
    assert selection["targets"] == ["test/la/top2"]
    # the sweep table: a column like any logged metric
    for seed in (0, 1):
        make_job(tmp_path / "multirun", "mlp", "kron", seed, {k: v for k, v in metrics.items() if k.startswith("test/")})
    md, csv_path, _ = tables.aggregate([tmp_path / "multirun"], "top2", results_dir=tmp_path / "results")
    assert "test/la/top2" in md.read_text() and "test/la/top2 mean" in csv_path.read_text()
    # gone after the block
    assert "top2" not in M.classification_metrics(*_probs_and_labels())
    assert R.lookup("test/la/top2") is None


def _probs_and_labels():
    g = torch.Generator().manual_seed(0)
    return torch.softmax(torch.randn(20, 4, generator=g), -1), torch.randint(0, 4, (20,), generator=g)


def test_the_builtin_metrics_and_their_directions():
    assert list(M.classification_metrics(*_probs_and_labels())) == ["acc", "nll", "brier", "ece", "mce", "conf",
                                                                     "entropy"]
    assert list(M.classification_metrics(*_probs_and_labels(), section="test"))[-1] == "ece_redux"
    lower = ["test/la/nll", "test/map/ece", "test/la/brier", "test/la/rmse", "ood/svhn/la/fpr95", "test/la/mce",
             "test/la/ece_redux", "ood/noise/la/conf", "mean(shift/rot_*/la/ece)"]
    higher = ["test/la/acc", "test/la/ll", "ood/svhn/la/auroc", "laplace/log_marglik"]
    assert not any(model_selection.higher_is_better(k) for k in lower)
    assert all(model_selection.higher_is_better(k) for k in higher)
    assert model_selection.higher_is_better("laplace/my_loss", ("my_loss",)) is False
    # coverage: closer to the nominal level is better
    cov = R.lookup("test/la/cov_95")
    assert (cov.target, cov.label, cov.goodness(0.94) > cov.goodness(0.99)) == (0.95, "95% coverage", True)
    assert R.lookup("test/la/cov_99.9").target == pytest.approx(0.999) and R.lookup("test/la/cov_x") is None
    with pytest.raises(ValueError, match="test/la/conf.*no better direction"):
        model_selection.validate_spec({"score": "s", "candidates": ["m"], "within": ["d"], "targets": ["test/la/conf"]})
    assert R.label("nll") == "NLL" and R.label("ece") == "ECE" and R.label("acc") == "accuracy"
    assert R.label("angle") == "angle"  # not a metric: the name itself


def test_bad_declarations_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"kind='probs'; allowed: \['classification', 'ood', 'regression'\]"):
        R.Metric("x", "probs", "x", R.HIGHER)
    with pytest.raises(ValueError, match="direction=2; allowed"):
        R.Metric("x", "classification", "x", 2)
    with pytest.raises(ValueError, match="a target is needed exactly when direction=0"):
        R.Metric("x", "regression", "x", R.TARGET)
    with pytest.raises(ValueError, match="noise='paired' needs per_point"):
        R.Metric("x", "classification", "x", R.LOWER, noise="paired")
    with pytest.raises(ValueError, match="a tolerance .* needs a direction"):
        R.Metric("x", "classification", "x", None, tolerance=0.1)
    with pytest.raises(ValueError, match="classification metric 'nll' is already registered"):
        R.register(R.Metric("nll", "classification", "NLL", R.LOWER))
    with pytest.raises(ValueError, match="kind='x'; allowed"):
        R.metrics_of("x")
