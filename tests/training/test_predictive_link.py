"""``training.predictors.predictive_link``: the configured link for classification; Gaussian
regression's glm predictive in closed form whatever the link (laplace-torch's ``la(x)``)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from laplace_lab.training.predictors import predictive_link


@pytest.mark.parametrize("likelihood, pred_type, link, expected", [
    ("classification", "glm", "mc", "mc"),
    ("classification", "glm", "probit", "probit"),
    ("regression", "glm", "mc", None),
    ("regression", "glm", "probit", None),
    ("regression", "nn", "mc", "mc"),
    ("heteroscedastic_regression", "glm", "mc", "mc"),
])
def test_predictive_link(likelihood, pred_type, link, expected):
    predictive = OmegaConf.create({"pred_type": pred_type, "link_approx": link, "n_samples": 10})
    assert predictive_link(likelihood, predictive) == expected
