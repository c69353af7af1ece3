"""``evaluation.summary``: what Laplace changed against the MAP, in plain words, and the default
runs (``make run``, ``data=sinusoid``) that print it."""

from __future__ import annotations

import logging

from laplace_lab.evaluation.labels import dataset_label, laplace_label
from laplace_lab.evaluation.summary import format_summary, laplace_changes
from laplace_lab.train import run
from tests.conftest import compose_config


def _verdicts(metrics, **kw):
    return {c.key: c.verdict for c in laplace_changes(metrics, **kw)}


def test_verdicts_name_what_got_worse():
    metrics = {"test/map/nll": 0.036, "test/la/nll": 0.042, "test/map/acc": 0.996, "test/la/acc": 0.996,
               "test/map/ece": 0.026, "test/la/ece": 0.0265,
               "ood/far_away/map/conf": 0.9997, "ood/far_away/la/conf": 0.987,
               "ood/far_away/map/auroc": 0.003, "ood/far_away/la/auroc": 0.07,
               "shift/rot_0/map/nll": 0.1, "shift/rot_0/la/nll": 0.1, "shift/rot_90/map/nll": 3.0,
               "shift/rot_90/la/nll": 2.0, "test/de/nll": 0.01}
    assert _verdicts(metrics) == {"test/nll": "worse", "test/acc": "same", "test/ece": "same",
                                  "ood/far_away/conf": "better", "ood/far_away/auroc": "worse than chance (both)",
                                  "shift/rot_mean/nll": "better"}
    text = format_summary(metrics, "last-layer KFAC-GGN, GLM predictive (MC)", "toy2d moons", far_away_alpha=100)
    assert text.splitlines()[0] == "What Laplace (last-layer KFAC-GGN, GLM predictive (MC)) changed against the MAP on toy2d moons:"
    assert "mean confidence on far-away inputs (test x 100)" in text
    assert "NLL on rotated test sets, mean of 2 angles" in text
    assert "  In distribution (test set): Laplace is worse on NLL; the same on accuracy, ECE." in text
    assert ("  Away from the training data: Laplace is better on confidence on far-away, NLL under rotation; like the "
            "MAP worse than chance on AUROC vs far-away.") in text


def test_a_difference_within_two_standard_errors_is_the_same_within_noise():
    """noise/<key> is the standard error of la - map: beyond the tolerance but within 2 of them the
    verdict is 'same within noise'; beyond, better / worse; without an estimate, the tolerance alone."""
    base = {"test/map/nll": 0.300, "test/la/nll": 0.290, "test/map/ece": 0.050, "test/la/ece": 0.060,
            "ood/far_away/map/conf": 0.99, "ood/far_away/la/conf": 0.95}
    noisy = {**base, "noise/test/nll": 0.006, "noise/test/ece": 0.004, "noise/ood/far_away/conf": 0.025}
    assert _verdicts(noisy) == {"test/nll": "same within noise", "test/ece": "worse",  # 0.010 <= 0.012; 0.010 > 0.008
                                "ood/far_away/conf": "same within noise"}
    assert _verdicts(base) == {"test/nll": "better", "test/ece": "worse", "ood/far_away/conf": "better"}
    tight = {**noisy, "noise/test/nll": 0.0049, "noise/ood/far_away/conf": 0.019}
    assert _verdicts(tight) == {"test/nll": "better", "test/ece": "worse", "ood/far_away/conf": "better"}
    text = format_summary(noisy)
    assert "0.3000   0.2900   0.0120  same within noise" in text  # the noise column: 2 standard errors
    assert "Laplace is worse on ECE; the same within noise on NLL." in text
    assert "-': not estimated" in text.splitlines()[-1]
    assert "      -  better" in format_summary(base)


def test_an_auroc_below_chance_is_worse_than_chance_whatever_moved():
    both = {"ood/far_away/map/auroc": 0.0031, "ood/far_away/la/auroc": 0.0668, "noise/ood/far_away/auroc": 0.01}
    one = {"ood/far_away/map/auroc": 0.30, "ood/far_away/la/auroc": 0.80, "noise/ood/far_away/auroc": 0.05}
    worse = {"ood/noise/map/auroc": 0.60, "ood/noise/la/auroc": 0.45, "noise/ood/noise/auroc": 0.02}
    above = {"ood/noise/map/auroc": 0.60, "ood/noise/la/auroc": 0.62, "noise/ood/noise/auroc": 0.02}
    assert _verdicts(both) == {"ood/far_away/auroc": "worse than chance (both)"}
    assert _verdicts(one) == {"ood/far_away/auroc": "better (MAP worse than chance)"}
    assert _verdicts(worse) == {"ood/noise/auroc": "worse (Laplace worse than chance)"}
    assert _verdicts(above) == {"ood/noise/auroc": "same within noise"}
    assert "Laplace is like the MAP worse than chance on AUROC vs far-away." in format_summary(both)
    assert "Laplace is better on AUROC vs far-away." in format_summary(one)


def test_regression_coverage_is_better_when_closer_to_nominal():
    metrics = {"test/map/cov_90": 1.0, "test/la/cov_90": 0.87, "test/map/cov_50": 0.5, "test/la/cov_50": 0.3,
               "test/map/ll": -0.98, "test/la/ll": -0.37, "test/map/rmse": 0.35, "test/la/rmse": 0.35}
    assert _verdicts(metrics) == {"test/cov_90": "better", "test/cov_50": "worse", "test/ll": "better",
                                  "test/rmse": "same"}


def test_no_laplace_no_summary():
    assert format_summary({"test/map/nll": 0.1}) == ""


def test_labels():
    assert dataset_label({"_target_": "laplace_lab.data.Toy2DDataModule", "kind": "moons"}) == "toy2d moons"
    assert dataset_label({"_target_": "laplace_lab.data.UCIDataModule", "name": "yacht", "split": 3}) == "uci yacht (split 3)"
    assert dataset_label({"_target_": "laplace_lab.data.VisionDataModule", "name": "mnist", "transform": "none"}) == "mnist"
    assert dataset_label({"_target_": "laplace_lab.data.SinusoidDataModule"}) == "sinusoid"
    cfg = compose_config([])
    assert laplace_label(cfg) == "all-weights KFAC-GGN, GLM predictive (MC)"
    assert laplace_label(cfg, "regression") == "all-weights KFAC-GGN, GLM predictive (closed form)"
    assert laplace_label(compose_config(["method=la"])) == "last-layer KFAC-GGN, GLM predictive (probit)"
    assert laplace_label(compose_config(["method=kron"])) == "all-weights KFAC-GGN, GLM predictive (probit)"


def test_the_default_run_trains_its_map_and_shows_what_laplace_changed(tmp_path, capsys):
    """``make run``: the toy2d recipe (data_recipe/toy2d.yaml) trains the MAP to convergence, the
    default predictive is MC over the full covariance, and the summary names the far-away effect."""
    cfg = compose_config(["evaluation.progress=false", "evaluation.toy2d.resolution=20"])
    assert (cfg.optimizer.lr, cfg.trainer.max_epochs, cfg.predictive.link_approx) == (1e-2, 100, "mc")
    metrics = run(cfg, tmp_path)
    out = capsys.readouterr().out
    assert metrics["test/map/acc"] > 0.98  # 0.88 with the root defaults' 160 steps at 1e-3
    assert metrics["test/la/acc"] == metrics["test/map/acc"]
    # seed 0: 0.9997 -> 0.9737 (noise 0.0069); the last-layer Laplace of the earlier default: 0.9866
    assert metrics["ood/far_away/la/conf"] < metrics["ood/far_away/map/conf"] - 0.02
    assert "What Laplace (all-weights KFAC-GGN, GLM predictive (MC)) changed against the MAP on toy2d moons:" in out
    assert "Away from the training data: Laplace is better on confidence on far-away" in out


def test_the_sinusoid_example_trains_and_laplace_improves_the_likelihood(tmp_path, capsys, caplog):
    cfg = compose_config(["data=sinusoid", "evaluation.progress=false"])
    with caplog.at_level(logging.WARNING):
        metrics = run(cfg, tmp_path)
    assert not [r for r in caplog.records if "Under-trained" in r.getMessage()]
    assert metrics["test/la/ll"] > metrics["test/map/ll"]
    assert "In distribution (test set): Laplace is better on log likelihood" in capsys.readouterr().out
