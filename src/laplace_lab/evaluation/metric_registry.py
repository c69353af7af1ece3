"""The metric registry: one ``Metric`` per metric, declared once beside its function
(``evaluation.metrics``), and read by everything that names, computes or judges metrics.

A ``Metric`` states what the rest of laplace-lab needs to know:

- ``kind``, the predictive and data it is a function of (``KINDS``), and so the call of ``compute``:
  ``classification``: ``compute(probs [N, C], y [N], n_bins) -> float`` on a labelled set (the test
  set, each rotated or corrupted set, each FGSM strength); ``ood``: ``compute(probs_in [N_in, C],
  probs_out [N_out, C]) -> float`` of one OOD set against the test set; ``regression``:
  ``compute(mean [N, O], var [N, O], y [N, O]) -> float``, the Gaussian predictive in original
  target units.
- ``key``: the last part of its logged keys (``test/<predictor>/<key>``), also the column of the
  evaluation's CSV tables and of the results tables; ``label``: its name for people (figure axes,
  panel titles, the console summary's closing lines).
- ``direction``: ``HIGHER`` (+1) or ``LOWER`` (-1) is better, ``TARGET`` (0: closer to ``target``
  is better), or ``None`` (no better side, e.g. the mean confidence on the test set).
  ``goodness(value)`` turns a value into "higher is better" (model selection, the summary).
- ``tolerance``: the difference between the Laplace and the MAP predictive up to which the console
  summary (``evaluation.summary``) calls them the same; ``None`` keeps the metric out of the summary.
  ``summary_label`` / ``short`` name it there (``{name}``: the OOD set, for ``ood`` metrics).
- ``noise``: how ``evaluation.noise`` estimates the standard error of la - map: ``"paired"`` (a
  mean over points: the paired closed form over ``per_point(probs, y) -> [N]``), ``"bootstrap"``
  (resamples of the points), or ``None`` (not estimated).
- ``sections``: the labelled sections (``runner``) that compute it; empty: every one of its kind.

Order: the order of registration is the order of a run's dicts and CSV columns (and of the summary).
Coverage of a central interval is a family (``cov_<percent>``, one level per
``evaluation.regression.coverage_levels``): ``register_family`` declares the rule that makes its
``Metric`` from a key.

This module imports nothing heavy (no torch): ``reporting`` reads labels and directions from it;
``declared()`` imports ``evaluation.metrics``, where the built-in metrics are registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

KINDS = ("classification", "ood", "regression")
HIGHER, LOWER, TARGET = 1, -1, 0
NOISE_RULES = ("paired", "bootstrap")
DECLARING_MODULE = "laplace_lab.evaluation.metrics"


@dataclass(frozen=True)
class Metric:
    """One metric (module docstring)."""

    key: str
    kind: str
    label: str
    direction: int | None
    compute: Callable[..., float] | None = None
    tolerance: float | None = None
    target: float | None = None
    noise: str | None = None
    per_point: Callable | None = None
    sections: tuple[str, ...] = ()
    summary_label: str = ""
    short: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Metric {self.key!r}: kind={self.kind!r}; allowed: {list(KINDS)}")
        if self.direction not in (HIGHER, LOWER, TARGET, None):
            raise ValueError(f"Metric {self.key!r}: direction={self.direction!r}; allowed: "
                             f"{HIGHER} (higher is better), {LOWER} (lower), {TARGET} (closer to target), None")
        if (self.direction == TARGET) != (self.target is not None):
            raise ValueError(f"Metric {self.key!r}: a target is needed exactly when direction={TARGET}")
        if self.noise not in (*NOISE_RULES, None):
            raise ValueError(f"Metric {self.key!r}: noise={self.noise!r}; allowed: {list(NOISE_RULES)} or None")
        if self.noise == "paired" and self.per_point is None:
            raise ValueError(f"Metric {self.key!r}: noise='paired' needs per_point (the values it is the mean of)")
        if self.tolerance is not None and self.direction is None:
            raise ValueError(f"Metric {self.key!r}: a tolerance (the console summary) needs a direction")

    @property
    def in_summary(self) -> bool:
        return self.tolerance is not None

    def summary_text(self) -> tuple[str, str]:
        """(its label in the summary's table, its name in the closing lines)."""
        return self.summary_label or f"test {self.label}", self.short or self.label

    def computed_in(self, section: str | None) -> bool:
        """Whether the labelled ``section`` computes it (``None``: any section)."""
        return not self.sections or section in self.sections

    def goodness(self, value: float) -> float:
        """``value`` oriented so that higher is better (``-|value - target|`` for a target)."""
        if self.direction is None:
            raise ValueError(f"metric {self.key!r} has no better direction (direction=None)")
        return -abs(value - self.target) if self.direction == TARGET else self.direction * value


_METRICS: dict[tuple[str, str], Metric] = {}
_FAMILIES: dict[tuple[str, str], Callable[[str], Metric | None]] = {}


def register(metric: Metric) -> Metric:
    """Add ``metric``; a second metric with its kind and key raises."""
    if (metric.kind, metric.key) in _METRICS:
        raise ValueError(f"a {metric.kind} metric {metric.key!r} is already registered")
    _METRICS[(metric.kind, metric.key)] = metric
    return metric


def unregister(kind: str, key: str) -> None:
    del _METRICS[(kind, key)]


@contextmanager
def registered(metric: Metric) -> Iterator[Metric]:
    """``metric`` registered for the ``with`` block (tests, one-off studies)."""
    declared()
    register(metric)
    try:
        yield metric
    finally:
        unregister(metric.kind, metric.key)


def register_family(kind: str, prefix: str, make: Callable[[str], Metric | None]) -> None:
    """Keys ``<prefix><rest>`` of ``kind`` are the metric ``make(rest)`` (e.g. ``cov_95``; ``None``:
    ``rest`` names no member)."""
    _FAMILIES[(kind, prefix)] = make


def declared() -> None:
    """Import the module that registers the built-in metrics (``evaluation.metrics``)."""
    importlib.import_module(DECLARING_MODULE)


def metrics_of(kind: str, section: str | None = None) -> list[Metric]:
    """The registered metrics of ``kind`` in registration order (``section``: those it computes)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {list(KINDS)}")
    declared()
    return [m for (k, _), m in _METRICS.items() if k == kind and m.computed_in(section)]


def lookup(key: str, kind: str | None = None) -> Metric | None:
    """The metric that a name or a logged key ends in (``test/la/nll`` -> nll), ``None`` if none.

    ``kind`` defaults to the key's section: ``ood/...`` is ``ood``, otherwise a labelled set's
    classification or regression metric (their keys do not overlap)."""
    declared()
    name = key.rsplit("/", 1)[-1]
    kinds = [kind] if kind else ["ood"] if key.startswith("ood/") else ["classification", "regression"]
    for k in kinds:
        if (k, name) in _METRICS:
            return _METRICS[(k, name)]
        for (family_kind, prefix), make in _FAMILIES.items():
            if family_kind == k and name.startswith(prefix):
                member = make(name[len(prefix):])
                if member is not None:
                    return member
    return None


def in_order(metrics: list[Metric]) -> list[Metric]:
    """``metrics`` in registration order, family members (not registered themselves) after, by
    target, then key."""
    position = {m: i for i, m in enumerate(_METRICS.values())}
    return sorted(metrics, key=lambda m: (position.get(m, len(position)), m.target or 0.0, m.key))


def label(key: str, kind: str | None = None) -> str:
    """The registered label of ``key`` (``lookup``), else ``key`` itself (e.g. a table column)."""
    metric = lookup(key, kind)
    return metric.label if metric is not None else key
