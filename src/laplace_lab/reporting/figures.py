"""Figures that ``laplace_lab.reporting.tables`` draws from the jobs themselves (not copied from one job):
per-epoch metrics read from each job's ``csv/metrics.csv``, the mean over the seeds of a group as
one line, the seeds' range (min to max) shaded. An ``aggregate.figures`` entry (or ``--figures``)
naming one of ``TABLE_FIGURES`` writes ``<name>_figures/<figure>.png``, one figure for the table.

``augmentation_eta_rotation`` / ``augmentation_eta_translate_x``: the learned range ``|eta|`` of
``AugmentationMarglik`` (``augmentation/rotation`` in degrees, ``augmentation/translate_x`` in
half image widths) after each epoch, one line per group (e.g. data.transform x augmentation.mode).

Per-epoch rows of ``csv/metrics.csv`` are those with an ``epoch`` (Lightning's 0-based epoch, shown
here as ``epoch + 1``: the value after that epoch's eta step); the final-metrics row has none.

``shift_rotation``: the rotated-test-set curves of each job's ``tables/shift_rotation.csv``
(accuracy, NLL, ECE, confidence against the angle, each axis named by the metric's registered
label, ``evaluation.metric_registry``), one line per group and predictor, the mean
over the group's seeds with error bars of one standard error (sample std / sqrt(n)), the tables'
convention. Every figure has the evaluation's style (``evaluation.plots.new_figure``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EpochFigure:
    metric: str
    ylabel: str
    scale: float = 1.0


@dataclass(frozen=True)
class SeedCurves:
    """Curves from each job's ``tables/<table>.csv``: ``metrics`` against ``x``, per predictor."""

    table: str
    x: str
    metrics: tuple[str, ...]
    xlabel: str


TABLE_FIGURES = {
    "augmentation_eta_rotation": EpochFigure("augmentation/rotation", "rotation range |eta| (degrees)",
                                             180 / math.pi),
    "augmentation_eta_translate_x": EpochFigure("augmentation/translate_x",
                                                "x-translation range |eta| (half image widths)"),
    "shift_rotation": SeedCurves("shift_rotation", "angle", ("acc", "nll", "ece", "conf"), "rotation (degrees)"),
}


def epoch_series(job: Path, metric: str) -> dict[int, float]:
    """``{epoch (1-based): value}`` of ``metric`` in ``job/csv/metrics.csv`` (empty if none)."""
    path = job / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("epoch") and row.get(metric):
                out[int(float(row["epoch"])) + 1] = float(row[metric])
    return out


def seed_band(series: list[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Epochs, mean, min and max over the seeds' series (each epoch over the seeds that have it)."""
    epochs = sorted({e for s in series for e in s})
    values = [[s[e] for s in series if e in s] for e in epochs]
    return (epochs, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values])


def seed_curves(jobs: list[Path], spec: SeedCurves) -> dict[str, dict[float, list[dict[str, float]]]]:
    """``{predictor: {x: [one row of metrics per job]}}`` from the jobs' ``tables/<spec.table>.csv``."""
    out: dict[str, dict[float, list[dict[str, float]]]] = {}
    for job in jobs:
        path = job / "tables" / f"{spec.table}.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                values = {m: float(row[m]) for m in spec.metrics if row.get(m) not in (None, "")}
                out.setdefault(row["predictor"], {}).setdefault(float(row[spec.x]), []).append(values)
    return out


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); 0 for n = 1)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def _draw_seed_curves(name: str, spec: SeedCurves, groups: dict[str, list[Path]], out: Path) -> Path | None:
    from laplace_lab.evaluation.labels import predictor_label
    from laplace_lab.evaluation.metric_registry import label as metric_label
    from laplace_lab.evaluation.plots import new_figure, palette

    curves = {(label, p): by_x for label, jobs in groups.items() for p, by_x in seed_curves(jobs, spec).items()}
    if not curves:
        return None
    colors = palette([f"{g} {p}" for g, p in curves])
    fig, axes = new_figure(1, len(spec.metrics), size=(3.4, 2.9))
    for (group, pred), by_x in curves.items():
        xs = sorted(by_x)
        n = max(len(by_x[x]) for x in xs)
        line_label = f"{group}: {predictor_label(pred)} (n={n})" if len(groups) > 1 else f"{predictor_label(pred)} (n={n})"
        for ax, metric in zip(axes[0], spec.metrics):
            stats = [mean_and_se([r[metric] for r in by_x[x] if metric in r]) for x in xs]
            ax.errorbar(xs, [m for m, _ in stats], yerr=[se for _, se in stats], marker="o", markersize=3,
                        capsize=2, linewidth=1.2, color=colors[f"{group} {pred}"], label=line_label)
            ax.set(xlabel=spec.xlabel, ylabel=metric_label(metric, "classification"))
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", fontsize="small", frameon=False)
    table = out.parent.name.removesuffix("_figures")  # <results dir>/<table>_figures/<name>.png
    fig.suptitle(f"{table}: {name}, mean over seeds, error bars one standard error")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def draw(name: str, groups: dict[str, list[Path]], out: Path) -> Path | None:
    """Draw figure ``name`` (a ``TABLE_FIGURES`` key) over ``{group label: job folders}`` into
    ``out``; ``None`` when no job has the data."""
    from laplace_lab.evaluation.plots import new_figure

    spec = TABLE_FIGURES[name]
    if isinstance(spec, SeedCurves):
        return _draw_seed_curves(name, spec, groups, out)
    lines = {}
    for label, jobs in groups.items():
        series = [s for s in (epoch_series(j, spec.metric) for j in jobs) if s]
        if series:
            lines[label] = (len(series), seed_band(series))
    if not lines:
        return None
    fig, axes = new_figure(1, 1, size=(7, 4))
    ax = axes[0, 0]
    for label, (n, (epochs, mean, lo, hi)) in lines.items():
        (line,) = ax.plot(epochs, [v * spec.scale for v in mean], label=f"{label} (n={n})")
        if n > 1:
            ax.fill_between(epochs, [v * spec.scale for v in lo], [v * spec.scale for v in hi],
                            color=line.get_color(), alpha=0.2)
    ax.set(xlabel="epoch", ylabel=spec.ylabel, title=f"{name}: mean over seeds (shaded: min-max)")
    ax.legend(fontsize=6)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
