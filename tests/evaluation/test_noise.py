"""``evaluation.noise``: standard errors of la - map by a paired bootstrap over the points."""

from __future__ import annotations

import math

import pytest
import torch

from laplace_lab.evaluation.noise import (
    N_BOOT,
    bootstrap_se,
    classification_noise,
    mean_noise,
    noise_key,
    ood_noise,
    regression_noise,
)


def test_the_bootstrap_error_of_a_mean_is_the_textbook_one():
    """For a mean over n points the standard error is std / sqrt(n); the bootstrap's own relative
    error is about 1 / sqrt(2 N_BOOT) = 5%, so 20% is four of its standard deviations."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(400, generator=g, dtype=torch.float64), torch.randn(400, generator=g, dtype=torch.float64)
    b = a + 0.3 * b  # paired: the difference's spread, not each one's, sets the error
    expected = (b - a).std().item() / math.sqrt(400)
    assert mean_noise(a, b) == pytest.approx(expected, rel=0.2)
    assert mean_noise(a, a.clone()) == 0.0


def test_bootstrap_se_draws_each_set_with_replacement_and_checks_its_input():
    seen = []
    bootstrap_se(lambda i, o: seen.append((len(i), len(o), int(i.max()), int(o.max()))) or {"x": 0.0}, (5, 3))
    assert len(seen) == N_BOOT and all(s[:2] == (5, 3) and s[2] < 5 and s[3] < 3 for s in seen)
    with pytest.raises(ValueError, match="n_boot >= 2 and non-empty sets"):
        bootstrap_se(lambda i: {"x": 0.0}, (0,))


def test_identical_predictors_have_no_noise_and_different_ones_do():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(300, 3, generator=g), -1)
    q = torch.softmax(torch.randn(300, 3, generator=g), -1)
    y = torch.randint(0, 3, (300,), generator=g)
    same = classification_noise(p, p.clone(), y, n_bins=10, n_boot=5)
    assert set(same) == {"nll", "brier", "acc", "ece"} and all(v == 0.0 for v in same.values())
    assert all(v > 0 for v in classification_noise(p, q, y, n_bins=10, n_boot=5).values())
    ood = ood_noise(p, q, q[:100], p[:100], n_boot=5)
    assert set(ood) == {"conf", "auroc"} and all(v > 0 for v in ood.values())
    mean, var = torch.randn(50, 1, generator=g), torch.rand(50, 1, generator=g) + 0.1
    reg = regression_noise((mean, var), (mean, var * 2), torch.randn(50, 1, generator=g), n_boot=5,
                           levels=(0.9,))
    assert set(reg) == {"ll", "rmse", "cov_90"} and reg["rmse"] == 0.0 and reg["ll"] > 0


def test_noise_key():
    assert noise_key("ood", "far_away", "auroc") == "noise/ood/far_away/auroc"


def test_closed_form_of_a_mean_agrees_with_the_bootstrap():
    """The means use sd(d) / sqrt(n), what the bootstrap estimates: the two agree to its own error (~5%)."""
    from laplace_lab.evaluation import noise as N

    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(2000, generator=g), torch.rand(2000, generator=g)
    boot = N.bootstrap_se(lambda i: {"d": (b[i].double().mean() - a[i].double().mean()).item()}, (2000,), 400)["d"]
    assert N.paired_mean_se(b - a) == pytest.approx(boot, rel=0.15)
    assert N.mean_noise(a, b) == N.paired_mean_se(b - a)
