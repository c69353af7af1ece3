"""Scalar metrics for classification, calibration, OOD detection and regression.

Conventions (all functions return Python floats unless stated):
- ``probs``: ``[N, C]`` predictive probabilities (rows sum to 1); ``y``: ``[N]`` integer labels.
- NLL: mean over points of ``-log p(y|x)``, with ``p`` clamped at ``1e-12`` (so one
  zero-probability label costs 27.6 nats instead of ``inf``).
- Brier: mean over points of ``sum_c (p_c - onehot(y)_c)^2`` (range [0, 2]).
- Confidence: max-probability; entropy in nats.
- ECE / MCE: top-label calibration error with ``n_bins`` equal-width bins, from torchmetrics
  (``multiclass_calibration_error``, norm ``l1`` / ``max``). Bins are ``[lo, hi)`` and the top
  one ``[lo, 1]``: confidences of exactly 1.0 (common in float32 for overconfident nets) are
  moved one ulp below 1, because torchmetrics would otherwise put them in an extra bin of their
  own. ``calibration_bins`` is our own binning (for reliability diagrams); the tests check that
  both agree.
- ``ece_redux``: the ECE that the Laplace Redux authors' evaluation code computes
  (runame/laplace-redux ``utils.get_calib`` as it runs, with its ``M = 100`` bins): its bin loop
  never reaches the bins of confidences >= 0.99, so those predictions are left out and the
  count-weighted mean |confidence - accuracy| is over the 99 bins below 0.99 only; NaN when no
  prediction is below 0.99. On MNIST, where a trained LeNet is at least 0.99 sure of most test
  images (95% for the redux_mnist MAP network of seed 0), it measures the calibration of the few
  least confident predictions, not the standard ECE above.
- OOD: max-confidence is the score, in-distribution is the positive class. AUROC from
  torchmetrics; FPR at 95% TPR by hand: the threshold is the largest ``t`` with
  ``P_in(score >= t) >= 0.95``, FPR = ``P_out(score >= t)``.
- Regression: the predictor gives mean and variance in standardised units; metrics are reported
  in original units: ``y = y_std * s + m``. ``ll`` is the mean over points of the Gaussian log
  density summed over outputs; ``rmse`` over all points and outputs; ``cov_<q>`` the fraction of
  targets inside the central ``q`` interval ``mean +- z_{(1+q)/2} * sd``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from laplace_lab.evaluation.metric_registry import (
    HIGHER,
    LOWER,
    TARGET,
    Metric,
    metrics_of,
    register,
    register_family,
)

_EPS = 1e-12


def _check(probs: Tensor, y: Tensor) -> None:
    if probs.ndim != 2:
        raise ValueError(f"probs must have shape [N, C]; got {tuple(probs.shape)}")
    if y.shape != probs.shape[:1]:
        raise ValueError(f"labels must have shape [N]={tuple(probs.shape[:1])}; got {tuple(y.shape)}")


def correct(probs: Tensor, y: Tensor) -> Tensor:
    """Per-point 0/1 correctness of the top class, ``[N]`` float64 (its mean is ``accuracy``)."""
    _check(probs, y)
    return (probs.argmax(-1) == y).double()


def log_loss(probs: Tensor, y: Tensor) -> Tensor:
    """Per-point ``-log p(y|x)`` (``p`` clamped at 1e-12), ``[N]`` float64 (its mean is ``nll``)."""
    _check(probs, y)
    return -probs.double().gather(1, y.long()[:, None]).squeeze(1).clamp_min(_EPS).log()


def brier_score(probs: Tensor, y: Tensor) -> Tensor:
    """Per-point ``sum_c (p_c - onehot(y)_c)^2``, ``[N]`` float64 (its mean is ``brier``)."""
    _check(probs, y)
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[1]).double()
    return (probs.double() - onehot).pow(2).sum(1)


def per_point(probs: Tensor, y: Tensor) -> dict[str, Tensor]:
    """``{acc, nll, brier}`` of every point, ``[N]`` float64: the means are ``accuracy``, ``nll``
    and ``brier``."""
    return {"acc": correct(probs, y), "nll": log_loss(probs, y), "brier": brier_score(probs, y)}


def accuracy(probs: Tensor, y: Tensor) -> float:
    return correct(probs, y).mean().item()


def nll(probs: Tensor, y: Tensor) -> float:
    return log_loss(probs, y).mean().item()


def brier(probs: Tensor, y: Tensor) -> float:
    return brier_score(probs, y).mean().item()


def confidence(probs: Tensor) -> Tensor:
    """Per-point max-probability, ``[N]``."""
    return probs.max(-1).values


def mean_confidence(probs: Tensor) -> float:
    return confidence(probs).double().mean().item()


def entropy(probs: Tensor) -> Tensor:
    """Per-point predictive entropy in nats, ``[N]``."""
    p = probs.double()
    return -(p * p.clamp_min(_EPS).log()).sum(-1)


def mean_entropy(probs: Tensor) -> float:
    return entropy(probs).mean().item()


def _calib_probs(probs: Tensor) -> Tensor:
    """float32 probabilities in [0, 1 - ulp] (see module docstring)."""
    p = probs.detach().float()
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)).item()
    # clamping also keeps torchmetrics from treating slightly-out-of-range rows as logits
    return p.clamp(0.0, below_one)


def calibration_error(probs: Tensor, y: Tensor, n_bins: int = 15, norm: str = "l1") -> float:
    """Top-label calibration error via torchmetrics; ``norm="l1"`` is ECE, ``"max"`` is MCE."""
    _check(probs, y)
    # imported here: torchmetrics pulls in torchvision (seconds)
    from torchmetrics.functional.classification import multiclass_calibration_error

    return multiclass_calibration_error(
        _calib_probs(probs), y.long(), num_classes=probs.shape[1], n_bins=n_bins, norm=norm
    ).item()


def ece(probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    return calibration_error(probs, y, n_bins, "l1")


def mce(probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    return calibration_error(probs, y, n_bins, "max")


REDUX_ECE_BINS = 100  # utils.get_calib's M


def ece_redux(probs: Tensor, y: Tensor) -> float:
    """The Laplace Redux code's ECE (module docstring): equal-width bins of width 1/100 over the
    top-label confidence, predictions with confidence >= 0.99 left out, bins weighted by their
    share of the predictions kept."""
    _check(probs, y)
    conf, pred = probs.detach().double().max(-1)
    kept = conf < (REDUX_ECE_BINS - 1) / REDUX_ECE_BINS
    if not kept.any():
        return math.nan
    conf, correct = conf[kept], (pred[kept] == y[kept]).double()
    idx = (conf * REDUX_ECE_BINS).floor().long().clamp(0, REDUX_ECE_BINS - 2)
    count = torch.zeros(REDUX_ECE_BINS - 1, dtype=torch.float64).index_add_(0, idx, torch.ones_like(conf))
    gap = (torch.zeros_like(count).index_add_(0, idx, conf) - torch.zeros_like(count).index_add_(0, idx, correct)).abs()
    return (gap.sum() / count.sum()).item()


def calibration_bins(probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, Tensor]:
    """Our own equal-width binning of the top-label confidence (for reliability diagrams).

    Returns float64 tensors of shape ``[n_bins]``: ``bin_center``, ``accuracy`` and
    ``confidence`` (bin means, 0 for empty bins) and ``count``.
    """
    _check(probs, y)
    p = _calib_probs(probs)
    conf, pred = p.max(-1)
    correct = (pred == y).double()
    idx = (conf.double() * n_bins).floor().long().clamp(0, n_bins - 1)
    count = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, torch.ones_like(correct))
    acc_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, correct)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, conf.double())
    safe = count.clamp_min(1)
    return {
        "bin_center": (torch.arange(n_bins, dtype=torch.float64) + 0.5) / n_bins,
        "accuracy": acc_sum / safe,
        "confidence": conf_sum / safe,
        "count": count,
    }


def classification_metrics(probs: Tensor, y: Tensor, n_bins: int = 15, section: str | None = None) -> dict[str, float]:
    """Every registered classification metric of one predictor on one labelled set, in
    registration order: ``{acc, nll, brier, ece, mce, conf, entropy}`` (``section="test"`` adds
    ``ece_redux``, the metrics declared for that section only)."""
    return {m.key: m.compute(probs, y, n_bins) for m in metrics_of("classification", section)}


# ----------------------------------------------------------------------------------- OOD
def auroc(score_in: Tensor, score_out: Tensor) -> float:
    """Area under the ROC curve, in-distribution scores as positives (torchmetrics)."""
    scores = torch.cat([score_in, score_out]).double()
    target = torch.cat([torch.ones(len(score_in)), torch.zeros(len(score_out))]).long()
    from torchmetrics.functional.classification import binary_auroc  # imported here (seconds)

    return binary_auroc(scores, target).item()


def fpr_at_tpr(score_in: Tensor, score_out: Tensor, tpr: float = 0.95) -> float:
    """False positive rate on OOD at the threshold where ``tpr`` of in-distribution is kept."""
    if len(score_in) == 0 or len(score_out) == 0:
        raise ValueError("fpr_at_tpr needs non-empty in- and out-of-distribution scores")
    s_in = score_in.double().sort(descending=True).values
    k = math.ceil(tpr * len(s_in) - 1e-9)
    threshold = s_in[max(k, 1) - 1]
    return (score_out.double() >= threshold).double().mean().item()


def ood_metrics(probs_in: Tensor, probs_out: Tensor) -> dict[str, float]:
    """Every registered OOD metric of one predictor on one OOD set: ``{conf, entropy, auroc,
    fpr95}`` (``conf`` and ``entropy`` on the OOD set, max-confidence as the detection score)."""
    return {m.key: m.compute(probs_in, probs_out) for m in metrics_of("ood")}


# ---------------------------------------------------------------------------- regression
def _as_scale(v, like: Tensor) -> Tensor:
    return torch.as_tensor(v, dtype=torch.float64).reshape(-1).expand(like.shape[-1])


def to_original_units(mean: Tensor, var: Tensor, y: Tensor | None, target_mean=0.0, target_std=1.0,
                      y_standardised: bool = True):
    """``(mean, var, y)`` from standardised to original units (float64, shape ``[N, O]``)."""
    mean = mean.double().reshape(len(mean), -1)
    var = var.double().reshape(mean.shape)
    m, s = _as_scale(target_mean, mean), _as_scale(target_std, mean)
    out_y = None
    if y is not None:
        y = y.double().reshape(mean.shape)
        out_y = y * s + m if y_standardised else y
    return mean * s + m, var * s**2, out_y


def coverage(mean: Tensor, var: Tensor, y: Tensor, level: float) -> float:
    """Fraction of targets inside the central ``level`` Gaussian interval (any consistent units)."""
    z = torch.special.ndtri(torch.tensor((1.0 + level) / 2.0, dtype=torch.float64))
    return ((y.double() - mean.double()).abs() <= z * var.double().sqrt()).double().mean().item()


def gaussian_log_likelihood(mean: Tensor, var: Tensor, y: Tensor) -> Tensor:
    """Per-point log density summed over outputs, ``[N]`` (float64)."""
    mean, var, y = mean.double(), var.double(), y.double().reshape(mean.shape)
    ll = -0.5 * (math.log(2 * math.pi) + var.log() + (y - mean) ** 2 / var)
    return ll.reshape(len(ll), -1).sum(-1)


def coverage_key(level: float) -> str:
    """0.5 -> ``cov_50``, 0.95 -> ``cov_95``, 0.999 -> ``cov_99.9``."""
    return f"cov_{100 * level:.6g}"


def regression_metrics(mean: Tensor, var: Tensor, y: Tensor, target_mean=0.0, target_std=1.0,
                       levels: Sequence[float] = (0.5, 0.9, 0.95),
                       y_standardised: bool = True) -> dict[str, float]:
    """Every registered regression metric, ``{ll, rmse}``, and the coverage of each central
    interval in ``levels`` (``cov_50, cov_90, cov_95``), in original target units.

    ``mean``/``var``: ``[N, O]`` in standardised units; ``y``: ``[N, O]`` (or ``[N]`` when O=1),
    standardised unless ``y_standardised=False``.
    """
    if (var <= 0).any():
        raise ValueError("regression predictive variances must be positive")
    mean, var, y = to_original_units(mean, var, y, target_mean, target_std, y_standardised)
    metrics = [*metrics_of("regression"), *(coverage_metric(q) for q in levels)]
    return {m.key: m.compute(mean, var, y) for m in metrics}


def mean_log_likelihood(mean: Tensor, var: Tensor, y: Tensor) -> float:
    """Mean over points of the Gaussian log density summed over outputs (``ll``)."""
    return gaussian_log_likelihood(mean, var, y).mean().item()


def rmse(mean: Tensor, var: Tensor, y: Tensor) -> float:
    """Root mean squared error over all points and outputs (``var`` unused)."""
    return (y - mean).pow(2).mean().sqrt().item()


def coverage_metric(level: float) -> Metric:
    """The ``cov_<percent>`` metric of the central ``level`` interval (better: closer to ``level``)."""
    pct = f"{100 * level:.6g}"
    return Metric(coverage_key(level), "regression", f"{pct}% coverage", TARGET,
                  lambda mean, var, y: coverage(mean, var, y, level), tolerance=0.005, target=level,
                  noise="bootstrap", summary_label=f"coverage of central {pct}% intervals")


def _coverage_member(percent: str) -> Metric | None:
    try:
        level = float(percent) / 100
    except ValueError:
        return None
    return coverage_metric(level) if 0 < level < 1 else None


def _ood_scores(probs_in: Tensor, probs_out: Tensor) -> tuple[Tensor, Tensor]:
    return confidence(probs_in), confidence(probs_out)


# ------------------------------------------------------------------------- the registry
# One declaration per metric (``metric_registry``): the order here is the order of a run's dicts
# and tables. Tolerances: the console summary's "same" (``evaluation.summary``).
for _metric in (
    Metric("acc", "classification", "accuracy", HIGHER, lambda p, y, n_bins: accuracy(p, y), tolerance=0.0005,
           noise="paired", per_point=correct),
    Metric("nll", "classification", "NLL", LOWER, lambda p, y, n_bins: nll(p, y), tolerance=0.002,
           noise="paired", per_point=log_loss),
    Metric("brier", "classification", "Brier score", LOWER, lambda p, y, n_bins: brier(p, y), tolerance=0.002,
           noise="paired", per_point=brier_score),
    Metric("ece", "classification", "ECE", LOWER, ece, tolerance=0.002, noise="bootstrap"),
    Metric("mce", "classification", "MCE", LOWER, mce),
    Metric("conf", "classification", "mean confidence", None, lambda p, y, n_bins: mean_confidence(p)),
    Metric("entropy", "classification", "mean entropy (nats)", None, lambda p, y, n_bins: mean_entropy(p)),
    Metric("ece_redux", "classification", "ECE (Laplace Redux code)", LOWER, lambda p, y, n_bins: ece_redux(p, y),
           sections=("test",)),
    Metric("conf", "ood", "mean confidence", LOWER, lambda p_in, p_out: mean_confidence(p_out), tolerance=0.002,
           noise="paired", per_point=lambda p_in, p_out: confidence(p_out).double(),
           summary_label="mean confidence on {name}", short="confidence on {name}"),
    Metric("entropy", "ood", "mean entropy (nats)", HIGHER, lambda p_in, p_out: mean_entropy(p_out)),
    Metric("auroc", "ood", "AUROC", HIGHER, lambda p_in, p_out: auroc(*_ood_scores(p_in, p_out)), tolerance=0.002,
           noise="bootstrap", summary_label="AUROC test vs {name}", short="AUROC vs {name}"),
    Metric("fpr95", "ood", "FPR at 95% TPR", LOWER, lambda p_in, p_out: fpr_at_tpr(*_ood_scores(p_in, p_out), 0.95)),
    Metric("ll", "regression", "log likelihood", HIGHER, mean_log_likelihood, tolerance=0.002, noise="bootstrap",
           summary_label="test log likelihood per point"),
    Metric("rmse", "regression", "RMSE", LOWER, rmse, tolerance=1e-4, noise="bootstrap"),
):
    register(_metric)
register_family("regression", "cov_", _coverage_member)
