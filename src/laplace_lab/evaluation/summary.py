"""What the Laplace predictive changed against the MAP plug-in, in a few lines for the console.

``laplace_changes(metrics)`` reads a run's final metrics (``test/<predictor>/<metric>``,
``ood/<set>/<predictor>/<metric>``, ``toy2d/far/<predictor>/conf``, ``shift/rot_<deg>/...``) and
returns one ``Change`` per metric that both ``map`` and ``la`` have, each with a plain verdict:
``same`` (the difference is within the metric's tolerance, too small to matter), ``same within
noise`` (within ``NOISE_Z`` standard errors of la - map over the evaluation points, the run's
``noise/<key>`` metric: ``evaluation.noise``), else ``better`` or ``worse``. A metric without a
noise estimate (the rotated sets' means) is judged by its tolerance alone, and its noise column
shows ``-``. For the coverage of central intervals "better" means closer to the nominal level. An
AUROC below 0.5 (the OOD set more confident than the test set) is worse than chance: when both
are, the verdict is ``worse than chance (both)``, when one is, the verdict says which.
``format_summary`` makes the table and two closing lines, in distribution and away from it (OOD
sets, the toy grid's border, rotated test sets), that name what improved and, plainly, what got
worse.

Which metrics of the test set and the OOD sets it judges, their labels, directions and tolerances:
the registered metrics with a tolerance (``metric_registry``), so a new metric declared there is in
the summary without a change here.

Nothing is hidden: a metric that got worse is listed as worse, also when it is one the
literature expects Laplace to improve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laplace_lab.evaluation.metric_registry import Metric, in_order, lookup, metrics_of
from laplace_lab.evaluation.noise import noise_key

MAP, LAPLACE = "map", "la"
NOISE_Z = 2.0  # a difference is a change beyond 2 standard errors (about 95%, two-sided, if normal)
CHANCE_AUROC = 0.5


@dataclass(frozen=True)
class Judged:
    """How the summary reads one metric: its label, its short name for the closing lines, which
    direction is better (``+1`` higher, ``-1`` lower, ``0`` closer to ``target``) and the difference
    up to which the two predictors count as the same."""

    label: str
    short: str
    direction: int
    tolerance: float
    target: float | None = None

    @classmethod
    def of(cls, metric: Metric, name: str = "", short_name: str | None = None) -> Judged:
        """From a registered metric (``name`` / ``short_name``: the OOD set in its label / short name)."""
        label, short = metric.summary_text()
        return cls(label.format(name=name), short.format(name=name if short_name is None else short_name),
                   metric.direction, metric.tolerance, metric.target)


@dataclass(frozen=True)
class Change:
    key: str          # the metric's key less the predictor, e.g. "test/nll"
    label: str
    short: str
    map_value: float
    la_value: float
    verdict: str      # better | worse | same | same within noise | worse than chance (both); see the module
    se: float | None = None  # standard error of la - map (``noise/<key>``); None: not estimated

    @property
    def in_distribution(self) -> bool:
        return self.key.startswith("test/")


OOD_NAMES = {"far_away": "far-away inputs (test x {alpha})", "noise": "uniform noise"}
ROTATED = ("nll", "ece")  # the metrics averaged over the rotation angles


def _verdict(metric: Judged, map_value: float, la_value: float, se: float | None = None,
             auroc: bool = False) -> str:
    """The module's verdicts; ``se``: the standard error of la - map, ``auroc``: the metric is an
    AUROC (chance level 0.5)."""
    below = [name for name, v in (("MAP", map_value), ("Laplace", la_value)) if v < CHANCE_AUROC] if auroc else []
    if len(below) == 2:
        return "worse than chance (both)"
    if metric.direction == 0:
        map_value, la_value = -abs(map_value - metric.target), -abs(la_value - metric.target)
    diff = (la_value - map_value) * (metric.direction or 1)
    if abs(diff) <= metric.tolerance:
        verdict = "same"
    elif se is not None and abs(diff) <= NOISE_Z * se:
        verdict = "same within noise"
    else:
        verdict = "better" if diff > 0 else "worse"
    return f"{verdict} ({below[0]} worse than chance)" if below else verdict


def _test_metrics(metrics: dict[str, float]) -> list[Metric]:
    """The registered test-set metrics the summary judges (a tolerance) that the MAP has, in order."""
    found = (lookup(k.rsplit("/", 1)[-1]) for k in metrics if k.startswith(f"test/{MAP}/") and k.count("/") == 2)
    return in_order([m for m in found if m is not None and m.in_summary])


def _pair(metrics: dict[str, float], prefix: str, name: str) -> tuple[float, float] | None:
    a, b = metrics.get(f"{prefix}/{MAP}/{name}"), metrics.get(f"{prefix}/{LAPLACE}/{name}")
    return None if a is None or b is None else (float(a), float(b))


def laplace_changes(metrics: dict[str, float], far_away_alpha: float | None = None) -> list[Change]:
    """One ``Change`` per metric both ``map`` and ``la`` have: test metrics, confidence and AUROC
    per OOD set (``far_away_alpha``: the factor named in the far-away set's label), the mean
    confidence on the border of the zoomed-out toy grid, and the NLL and ECE averaged over the
    rotation angles."""
    changes = []

    def add(key: str, metric: Judged, pair: tuple[float, float] | None) -> None:
        if pair is not None:
            se = metrics.get(noise_key(key))
            se = None if se is None else float(se)
            verdict = _verdict(metric, *pair, se=se, auroc=key.endswith("/auroc"))
            changes.append(Change(key, metric.label, metric.short, pair[0], pair[1], verdict, se))

    for metric in _test_metrics(metrics):
        add(f"test/{metric.key}", Judged.of(metric), _pair(metrics, "test", metric.key))
    ood_sets = {k.split("/")[1] for k in metrics if k.startswith("ood/") and k.count("/") == 3}
    alpha = "alpha" if far_away_alpha is None else f"{far_away_alpha:g}"
    for ood in sorted(ood_sets, key=lambda s: (s != "far_away", s)):
        set_name = OOD_NAMES.get(ood, ood).format(alpha=alpha)
        for m in (m for m in metrics_of("ood") if m.in_summary):
            add(f"ood/{ood}/{m.key}", Judged.of(m, set_name, ood.replace("_", "-")), _pair(metrics, f"ood/{ood}", m.key))
    away = lookup("conf", "ood")  # the toy grid's border is judged like an OOD set's confidence
    add("toy2d/far/conf", Judged("mean confidence on the zoomed-out toy grid's border", "confidence on the toy "
                                 "grid's border", away.direction, away.tolerance), _pair(metrics, "toy2d/far", "conf"))
    for name in ROTATED:
        m = lookup(name, "classification")
        views = sorted({k.split("/")[1] for k in metrics if k.startswith("shift/rot_") and k.endswith(f"/{MAP}/{name}")})
        pairs = [p for p in (_pair(metrics, f"shift/{v}", name) for v in views) if p is not None]
        if pairs:
            mean = (sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs))
            add(f"shift/rot_mean/{name}", Judged(f"{m.label} on rotated test sets, mean of {len(pairs)} angles",
                                                 f"{m.label} under rotation", m.direction, m.tolerance), mean)
    return changes


CLOSING_WORDS = (("better", "better on"), ("worse", "worse on"), ("same within noise", "the same within noise on"),
                 ("same", "the same on"), ("worse than chance (both)", "like the MAP worse than chance on"))


def _closing_line(title: str, changes: list[Change]) -> str:
    parts = []
    for verdict, words in CLOSING_WORDS:
        names = [c.short for c in changes if c.verdict.split(" (")[0] == verdict or c.verdict == verdict]
        if names:
            parts.append(f"{words} {', '.join(names)}")
    return f"  {title}: Laplace is " + "; ".join(parts) + "."


def _noise_cell(c: Change) -> str:
    return "-" if c.se is None else f"{NOISE_Z * c.se:.4f}"


def format_summary(metrics: dict[str, float], method: str = "", dataset: str = "",
                   far_away_alpha: float | None = None) -> str:
    """The console summary: MAP against Laplace per metric with its verdict, then one line for
    the test set and one for the data away from it ("" when the run has no Laplace predictive)."""
    changes = laplace_changes(metrics, far_away_alpha)
    if not changes:
        return ""
    width = max(len(c.label) for c in changes)
    laplace = f"Laplace ({method})" if method else "Laplace"
    lines = [f"What {laplace} changed against the MAP{f' on {dataset}' if dataset else ''}:",
             f"  {'':{width}}  {'MAP':>7}  {'Laplace':>7}  {'noise':>7}"]
    lines += [f"  {c.label:{width}}  {c.map_value:7.4f}  {c.la_value:7.4f}  {_noise_cell(c):>7}  {c.verdict}"
              for c in changes]
    inside = [c for c in changes if c.in_distribution]
    away = [c for c in changes if not c.in_distribution]
    if inside:
        lines.append(_closing_line("In distribution (test set)", inside))
    if away:
        lines.append(_closing_line("Away from the training data", away))
    lines.append(f"  (noise: {NOISE_Z:g} standard errors of Laplace - MAP, paired bootstrap over the points; "
                 "a change within it is 'same within noise', '-': not estimated)")
    return "\n".join(lines)


def laplace_summary(metrics: dict[str, float], cfg: Mapping[str, Any], likelihood: str,
                    far_away_alpha: float | None = None) -> str:
    """``format_summary`` of a run, its predictive and data set named from its resolved config."""
    from laplace_lab.evaluation.labels import dataset_label, laplace_label

    return format_summary(metrics, laplace_label(cfg, likelihood), dataset_label(cfg.get("data") or {}),
                          far_away_alpha)
