"""Figures that ``laplace_lab.reporting.tables`` draws from the jobs themselves (not copied from one job):
per-epoch metrics read from each job's ``csv/metrics.csv``, the mean over the seeds of a group as
one line, the seeds' range (min to max) shaded. An ``aggregate.figures`` entry (or ``--figures``)
naming one of ``TABLE_FIGURES`` writes ``<name>_figures/<figure>.png``, one figure for the table.

``augmentation_eta_rotation`` / ``augmentation_eta_translate_x``: the learned range ``|eta|`` of
``AugmentationMarglik`` (``augmentation/rotation`` in degrees, ``augmentation/translate_x`` in
half image widths) after each epoch, one line per group (e.g. data.transform x augmentation.mode).

Per-epoch rows of ``csv/metrics.csv`` are those with an ``epoch`` (Lightning's 0-based epoch, shown
here as ``epoch + 1``: the value after that epoch's eta step); the final-metrics row has none.
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


TABLE_FIGURES = {
    "augmentation_eta_rotation": EpochFigure("augmentation/rotation", "rotation range |eta| (degrees)",
                                             180 / math.pi),
    "augmentation_eta_translate_x": EpochFigure("augmentation/translate_x",
                                                "x-translation range |eta| (half image widths)"),
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


def draw(name: str, groups: dict[str, list[Path]], out: Path) -> Path | None:
    """Draw figure ``name`` (a ``TABLE_FIGURES`` key) over ``{group label: job folders}`` into
    ``out``; ``None`` when no job has the metric per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = TABLE_FIGURES[name]
    lines = {}
    for label, jobs in groups.items():
        series = [s for s in (epoch_series(j, spec.metric) for j in jobs) if s]
        if series:
            lines[label] = (len(series), seed_band(series))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (n, (epochs, mean, lo, hi)) in lines.items():
        (line,) = ax.plot(epochs, [v * spec.scale for v in mean], label=f"{label} (n={n})")
        if n > 1:
            ax.fill_between(epochs, [v * spec.scale for v in lo], [v * spec.scale for v in hi],
                            color=line.get_color(), alpha=0.2)
    ax.set(xlabel="epoch", ylabel=spec.ylabel, title=f"{name}: mean over seeds (shaded: min-max)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
