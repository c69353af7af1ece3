"""How much of a difference between the Laplace and the MAP predictive is noise, for the console
summary (``evaluation.summary``): the standard error of ``metric(la) - metric(map)`` over the
evaluation points.

Both predictors see the same points, so the difference is paired. A metric that is a mean over
points (NLL, Brier, accuracy, confidence) has the closed form sd(d) / sqrt(n) of the per-point
differences d (``paired_mean_se``: what the bootstrap below estimates, without its cost). The other
statistics (ECE, AUROC, and the regression metrics, RMSE among them) use ``N_BOOT`` bootstrap
resamples that draw the points with replacement (the same indices for both predictors; a fixed seed):
the standard error is the standard deviation of the difference over the resamples. For an OOD set
the test points and the OOD points are drawn independently (AUROC needs both).

Keys: ``noise/<the metric's key less the predictor>``, e.g. ``noise/test/nll``,
``noise/ood/far_away/auroc``, ``noise/toy2d/far/conf``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from laplace_lab.evaluation import metrics as M

N_BOOT = 200  # resamples: the standard error's own relative error is about 1 / sqrt(2 N_BOOT) = 5%
SEED = 0
PREFIX = "noise"


def bootstrap_se(stat: Callable[..., dict[str, float]], sizes: tuple[int, ...], n_boot: int = N_BOOT,
                 seed: int = SEED) -> dict[str, float]:
    """Standard deviation over ``n_boot`` resamples of each value of ``stat(*idx)``, where ``idx``
    holds one resample (with replacement, ``[n]`` int64) of ``range(n)`` per entry ``n`` of ``sizes``."""
    if n_boot < 2 or any(n < 1 for n in sizes):
        raise ValueError(f"bootstrap_se needs n_boot >= 2 and non-empty sets; got n_boot={n_boot}, sizes={sizes}")
    g = torch.Generator().manual_seed(seed)
    draws = [stat(*(torch.randint(n, (n,), generator=g) for n in sizes)) for _ in range(n_boot)]
    return {k: torch.tensor([d[k] for d in draws], dtype=torch.float64).std().item() for k in draws[0]}


def paired_mean_se(d: Tensor) -> float:
    """Standard error of the mean of the paired differences ``d`` ``[n]``: sd(d) / sqrt(n) (0 for n < 2)."""
    d = d.double().reshape(-1)
    return (d.std() / len(d) ** 0.5).item() if len(d) > 1 else 0.0


def classification_noise(p_map: Tensor, p_la: Tensor, y: Tensor, n_bins: int, n_boot: int = N_BOOT) -> dict[str, float]:
    """``{nll, ece, brier, acc}``: standard errors of la - map on one labelled set (``[N, C]`` probs)."""
    a, b = M.per_point(p_map, y), M.per_point(p_la, y)
    means = {k: paired_mean_se(b[k] - a[k]) for k in a}
    ece = bootstrap_se(lambda idx: {"ece": M.ece(p_la[idx], y[idx], n_bins) - M.ece(p_map[idx], y[idx], n_bins)},
                       (len(y),), n_boot)
    return {**means, **ece}


def ood_noise(in_map: Tensor, in_la: Tensor, out_map: Tensor, out_la: Tensor, n_boot: int = N_BOOT) -> dict[str, float]:
    """``{conf, auroc}``: standard errors of la - map of the mean confidence on an OOD set and of
    the AUROC test vs that set (probs ``[N_in, C]`` and ``[N_out, C]``)."""
    c_in = {"map": M.confidence(in_map), "la": M.confidence(in_la)}
    c_out = {"map": M.confidence(out_map), "la": M.confidence(out_la)}

    def diff(i, o):
        return {"auroc": M.auroc(c_in["la"][i], c_out["la"][o]) - M.auroc(c_in["map"][i], c_out["map"][o])}

    return {"conf": paired_mean_se(c_out["la"].double() - c_out["map"].double()),
            **bootstrap_se(diff, (len(in_map), len(out_map)), n_boot)}


def mean_noise(map_values: Tensor, la_values: Tensor) -> float:
    """Standard error of ``mean(la_values) - mean(map_values)`` (paired values, e.g. the confidence
    at the same grid points)."""
    return paired_mean_se(la_values.double().reshape(-1) - map_values.double().reshape(-1))


def regression_noise(map_out: tuple[Tensor, Tensor], la_out: tuple[Tensor, Tensor], y: Tensor,
                     n_boot: int = N_BOOT, **units) -> dict[str, float]:
    """Standard errors of la - map of every ``metrics.regression_metrics`` value (``(mean, var)``
    per predictor; ``units``: that function's keyword arguments)."""
    def diff(idx):
        a = M.regression_metrics(map_out[0][idx], map_out[1][idx], y[idx], **units)
        b = M.regression_metrics(la_out[0][idx], la_out[1][idx], y[idx], **units)
        return {k: b[k] - a[k] for k in a}

    return bootstrap_se(diff, (len(y),), n_boot)


def noise_key(*parts: str) -> str:
    """``noise/<parts>``: ``noise_key("ood", "far_away", "auroc")`` -> ``noise/ood/far_away/auroc``."""
    return "/".join((PREFIX, *parts))
