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

Nothing is hidden: a metric that got worse is listed as worse, also when it is one the
literature expects Laplace to improve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laplace_lab.evaluation.noise import noise_key

MAP, LAPLACE = "map", "la"
NOISE_Z = 2.0  # a difference is a change beyond 2 standard errors (about 95%, two-sided, if normal)
CHANCE_AUROC = 0.5


@dataclass(frozen=True)
class Metric:
    """How to read one metric: its label, its short name for the closing lines, which direction
    is better (``+1`` higher, ``-1`` lower, ``0`` closer to ``target``) and the difference up to
    which the two predictors count as the same."""

    label: str
    short: str
    direction: int
    tolerance: float
    target: float | None = None


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


TEST_METRICS = {
    "nll": Metric("test NLL", "NLL", -1, 0.002),
    "ece": Metric("test ECE", "ECE", -1, 0.002),
    "brier": Metric("test Brier score", "Brier score", -1, 0.002),
    "acc": Metric("test accuracy", "accuracy", +1, 0.0005),
    "ll": Metric("test log likelihood per point", "log likelihood", +1, 0.002),
    "rmse": Metric("test RMSE", "RMSE", -1, 1e-4),
    "cov_50": Metric("coverage of central 50% intervals", "50% coverage", 0, 0.005, 0.50),
    "cov_90": Metric("coverage of central 90% intervals", "90% coverage", 0, 0.005, 0.90),
    "cov_95": Metric("coverage of central 95% intervals", "95% coverage", 0, 0.005, 0.95),
}
OOD_METRICS = {  # per OOD set; {name} is the set's name
    "conf": Metric("mean confidence on {name}", "confidence on {name}", -1, 0.002),
    "auroc": Metric("AUROC test vs {name}", "AUROC vs {name}", +1, 0.002),
}
OOD_NAMES = {"far_away": "far-away inputs (test x {alpha})", "noise": "uniform noise"}
ROTATED = {"nll": "NLL", "ece": "ECE"}


def _verdict(metric: Metric, map_value: float, la_value: float, se: float | None = None,
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


def _pair(metrics: dict[str, float], prefix: str, name: str) -> tuple[float, float] | None:
    a, b = metrics.get(f"{prefix}/{MAP}/{name}"), metrics.get(f"{prefix}/{LAPLACE}/{name}")
    return None if a is None or b is None else (float(a), float(b))


def laplace_changes(metrics: dict[str, float], far_away_alpha: float | None = None) -> list[Change]:
    """One ``Change`` per metric both ``map`` and ``la`` have: test metrics, confidence and AUROC
    per OOD set (``far_away_alpha``: the factor named in the far-away set's label), the mean
    confidence on the border of the zoomed-out toy grid, and the NLL and ECE averaged over the
    rotation angles."""
    changes = []

    def add(key: str, metric: Metric, pair: tuple[float, float] | None) -> None:
        if pair is not None:
            se = metrics.get(noise_key(key))
            se = None if se is None else float(se)
            verdict = _verdict(metric, *pair, se=se, auroc=key.endswith("/auroc"))
            changes.append(Change(key, metric.label, metric.short, pair[0], pair[1], verdict, se))

    for name, metric in TEST_METRICS.items():
        add(f"test/{name}", metric, _pair(metrics, "test", name))
    ood_sets = {k.split("/")[1] for k in metrics if k.startswith("ood/") and k.count("/") == 3}
    alpha = "alpha" if far_away_alpha is None else f"{far_away_alpha:g}"
    for ood in sorted(ood_sets, key=lambda s: (s != "far_away", s)):
        set_name = OOD_NAMES.get(ood, ood).format(alpha=alpha)
        for name, m in OOD_METRICS.items():
            metric = Metric(m.label.format(name=set_name), m.short.format(name=ood.replace("_", "-")),
                            m.direction, m.tolerance)
            add(f"ood/{ood}/{name}", metric, _pair(metrics, f"ood/{ood}", name))
    add("toy2d/far/conf", Metric("mean confidence on the zoomed-out toy grid's border", "confidence on the toy "
                                 "grid's border", -1, 0.002), _pair(metrics, "toy2d/far", "conf"))
    for name, label in ROTATED.items():
        views = sorted({k.split("/")[1] for k in metrics if k.startswith("shift/rot_") and k.endswith(f"/{MAP}/{name}")})
        pairs = [p for p in (_pair(metrics, f"shift/{v}", name) for v in views) if p is not None]
        if pairs:
            mean = (sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs))
            add(f"shift/rot_mean/{name}", Metric(f"{label} on rotated test sets, mean of {len(pairs)} angles",
                                                 f"{label} under rotation", -1, TEST_METRICS[name].tolerance), mean)
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
