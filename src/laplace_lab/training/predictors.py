"""Predictors for the evaluation: callables ``x -> probs [B, C]`` (classification) or
``x -> (mean [B, O], var [B, O])`` (regression, standardised units, var including noise)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from laplace_lab.config.schema import PredictiveConfig
from laplace_lab.training.module import MAPCore
from laplace_lab.training.nll import natural_to_mean_var


def map_predictor(module: MAPCore) -> Callable:
    """The plug-in (MAP) predictive of the trained network."""

    def predict(x: torch.Tensor):
        f = module.model(x)
        if module.likelihood == "classification":
            return torch.softmax(f, dim=-1)
        if module.likelihood == "heteroscedastic_regression":
            return natural_to_mean_var(f)
        return f, module.sigma_noise.to(f).pow(2).expand_as(f)

    return predict


def predictive_link(likelihood: str, predictive: PredictiveConfig) -> str | None:
    """``predictive.link_approx`` for classification; for Gaussian regression the glm predictive is
    Gaussian, so it is its closed form whatever the link (``None``), as laplace-torch's ``la(x)``
    (``predictive/`` documents the link as a classification option). ``pred_type=nn`` and
    heteroscedastic regression keep the configured link (their samples are the predictive)."""
    if likelihood == "regression" and predictive.pred_type == "glm":
        return None
    return predictive.link_approx


def laplace_predictor(la, predictive: PredictiveConfig, het_approx: str | None = None) -> Callable:
    """The Laplace predictive ``la(x, pred_type, link_approx, n_samples)`` of ``predictive/``
    (link: ``predictive_link``; heteroscedastic: with ``predictive.het_approx``, or ``het_approx``
    where given)."""
    link = predictive_link(la.likelihood, predictive)
    kwargs = {}
    if la.likelihood == "heteroscedastic_regression":
        kwargs["het_approx"] = het_approx or predictive.het_approx

    def predict(x: torch.Tensor):
        out = la(x, pred_type=predictive.pred_type, link_approx=link,
                 n_samples=int(predictive.n_samples), diagonal_output=True, **kwargs)
        if la.likelihood == "regression":  # la(x) returns the functional variance: add the noise
            return out[0], out[1] + la.sigma_noise.square().to(out[1])
        if isinstance(out, tuple):
            return out[0], out[1]
        return out

    return predict


def het_approx_alternatives(la, predictive: PredictiveConfig) -> dict[str, Callable]:
    """For a heteroscedastic glm closed-form predictive, the other closed form(s) as extra
    predictors ``la_het_<approx>`` (the table judges ``la``; these stay as extra columns)."""
    if la is None or la.likelihood != "heteroscedastic_regression" or predictive.pred_type != "glm" \
            or predictive.link_approx == "mc":
        return {}
    from laplace_lab.laplace.predictive import HET_APPROXES

    chosen = predictive.het_approx
    return {f"la_het_{a}": laplace_predictor(la, predictive, het_approx=a) for a in HET_APPROXES if a != chosen}


def mixture_predictor(members: list[Callable], task: str) -> Callable:
    """The uniform mixture of ``members`` (deep ensemble, MoLA; Eschenhagen et al. 2021).

    ``task="classification"``: the mean of the members' probabilities ``[B, C]``.
    ``task="regression"``: the mixture's mean ``[B, O]`` (mean of the member means) and total
    variance ``[B, O]`` = mean of the member variances + variance of the member means (the
    mixture's own variance: the divisor is K, not K - 1).
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task={task!r} is not supported; allowed: ['classification', 'regression']")
    if not members:
        raise ValueError("a mixture predictor needs at least one member")

    def predict(x: torch.Tensor):
        outs = [member(x) for member in members]
        if task == "classification":
            return torch.stack(outs).mean(0)
        means = torch.stack([m.reshape(len(x), -1) for m, _ in outs])
        variances = torch.stack([v.reshape(len(x), -1) for _, v in outs])
        return means.mean(0), variances.mean(0) + means.var(0, unbiased=False)

    return predict
