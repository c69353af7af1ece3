"""Predictors for the evaluation: callables ``x -> probs [B, C]`` (classification) or
``x -> (mean [B, O], var [B, O])`` (regression, standardised units, var including noise)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig

from laplace_lab.training.module import MAPModule
from laplace_lab.training.nll import natural_to_mean_var


def map_predictor(module: MAPModule) -> Callable:
    """The plug-in (MAP) predictive of the trained network."""

    def predict(x: torch.Tensor):
        f = module.model(x)
        if module.likelihood == "classification":
            return torch.softmax(f, dim=-1)
        if module.likelihood == "heteroscedastic_regression":
            return natural_to_mean_var(f)
        return f, module.sigma_noise.to(f).pow(2).expand_as(f)

    return predict


def laplace_predictor(la, predictive: DictConfig) -> Callable:
    """The Laplace predictive ``la(x, pred_type, link_approx, n_samples)`` of ``predictive/``."""

    def predict(x: torch.Tensor):
        out = la(x, pred_type=predictive.pred_type, link_approx=predictive.link_approx,
                 n_samples=int(predictive.n_samples), diagonal_output=True)
        if la.likelihood == "regression":  # la(x) returns the functional variance: add the noise
            return out[0], out[1] + la.sigma_noise.square().to(out[1])
        if isinstance(out, tuple):
            return out[0], out[1]
        return out

    return predict
