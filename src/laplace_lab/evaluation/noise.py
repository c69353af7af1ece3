"""How much of a difference between the Laplace and the MAP predictive is noise, for the console
summary (``evaluation.summary``): the standard error of ``metric(la) - metric(map)`` over the
evaluation points.

Both predictors see the same points, so the difference is paired. A metric that is a mean over
points (NLL, Brier, accuracy, confidence) has the closed form sd(d) / sqrt(n) of the per-point
differences d (``paired_mean_se``: what the bootstrap below estimates, without its cost). The other
statistics (ECE, AUROC, and the regression metrics, RMSE among them) use ``N_BOOT`` bootstrap
resamples that draw the points with replacement (the same indices for both predictors; a fixed seed):
the standard error is the standard deviation of the difference over the resamples. For an OOD set
the test points and the OOD points are drawn independently (AUROC needs both). Which metric gets
which estimate is its declared ``noise`` rule (``metric_registry``; ``None``: not estimated).

Keys: ``noise/<the metric's key less the predictor>``, e.g. ``noise/test/nll``,
``noise/ood/far_away/auroc``, ``noise/toy2d/far/conf``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from laplace_lab.evaluation import metrics as M
from laplace_lab.evaluation.metric_registry import lookup, metrics_of

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


def _paired_and_bootstrap(kind: str, args_map: tuple, args_la: tuple, sizes: tuple[int, ...], n_boot: int,
                          resample: Callable, **options) -> dict[str, float]:
    """Standard errors of la - map of every registered ``kind`` metric with a noise rule: the
    ``paired`` ones from their per-point values, the ``bootstrap`` ones over ``n_boot`` resamples
    (``resample(args, *idx)``: the arguments restricted to one resample)."""
    metrics = [m for m in metrics_of(kind) if m.noise]
    out = {m.key: paired_mean_se(m.per_point(*args_la) - m.per_point(*args_map)) for m in metrics if m.noise == "paired"}
    boot = [m for m in metrics if m.noise == "bootstrap"]
    if boot:
        def diff(*idx):
            a, b = resample(args_map, *idx), resample(args_la, *idx)
            return {m.key: m.compute(*b, **options) - m.compute(*a, **options) for m in boot}

        out |= bootstrap_se(diff, sizes, n_boot)
    return out


def classification_noise(p_map: Tensor, p_la: Tensor, y: Tensor, n_bins: int, n_boot: int = N_BOOT) -> dict[str, float]:
    """Standard errors of la - map on one labelled set (``[N, C]`` probs) of every classification
    metric with a noise rule (``metric_registry``): ``{acc, nll, brier, ece}``."""
    return _paired_and_bootstrap("classification", (p_map, y), (p_la, y), (len(y),), n_boot,
                                 lambda args, idx: (args[0][idx], args[1][idx]), n_bins=n_bins)


def ood_noise(in_map: Tensor, in_la: Tensor, out_map: Tensor, out_la: Tensor, n_boot: int = N_BOOT) -> dict[str, float]:
    """Standard errors of la - map of every OOD metric with a noise rule: ``{conf, auroc}``, the
    mean confidence on an OOD set and the AUROC test vs that set (probs ``[N_in, C]`` and
    ``[N_out, C]``; test and OOD points resampled independently)."""
    return _paired_and_bootstrap("ood", (in_map, out_map), (in_la, out_la), (len(in_map), len(out_map)), n_boot,
                                 lambda args, i, o: (args[0][i], args[1][o]))


def mean_noise(map_values: Tensor, la_values: Tensor) -> float:
    """Standard error of ``mean(la_values) - mean(map_values)`` (paired values, e.g. the confidence
    at the same grid points)."""
    return paired_mean_se(la_values.double().reshape(-1) - map_values.double().reshape(-1))


def regression_noise(map_out: tuple[Tensor, Tensor], la_out: tuple[Tensor, Tensor], y: Tensor,
                     n_boot: int = N_BOOT, **units) -> dict[str, float]:
    """Standard errors of la - map of every ``metrics.regression_metrics`` value with a noise rule
    (all by bootstrap; ``(mean, var)`` per predictor; ``units``: that function's keyword arguments)."""
    def diff(idx):
        a = M.regression_metrics(map_out[0][idx], map_out[1][idx], y[idx], **units)
        b = M.regression_metrics(la_out[0][idx], la_out[1][idx], y[idx], **units)
        return {k: b[k] - a[k] for k in a if lookup(k, "regression").noise}

    return bootstrap_se(diff, (len(y),), n_boot)


def noise_key(*parts: str) -> str:
    """``noise/<parts>``: ``noise_key("ood", "far_away", "auroc")`` -> ``noise/ood/far_away/auroc``."""
    return "/".join((PREFIX, *parts))
