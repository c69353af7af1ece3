"""Figures: reliability diagrams, confidence histograms, metric curves, regression coverage.

Every function takes long-format pandas frames and returns a ``matplotlib.figure.Figure`` on an
Agg canvas (no pyplot state, no display needed); ``report.Reporter`` saves it as PNG (with the
run's data set and Laplace predictive above the figure's own title) and sends it to wandb.
Histograms and metric curves are drawn with seaborn, imported on their first use (its import,
with scipy's, costs about 2 s); the rest use matplotlib alone. No global theme is set: every
axes gets ``style(ax)`` (also used by the tables' figures, ``laplace_lab.reporting.figures``), and
predictors are shown by name (``map`` as MAP, ``la`` as Laplace: ``labels.predictor_label``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from laplace_lab.evaluation.labels import predictor_label
from laplace_lab.evaluation.metric_registry import label as metric_label

# seaborn's "colorblind" palette (10 colours, cycled beyond)
COLORBLIND = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc",
              "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9")
# what the generated OOD sets are, for legends (``ood.far_away`` / ``ood.uniform_noise``)
OOD_CAPTIONS = {"far_away": "far-away: test inputs x {alpha} (Kristiadi et al. 2020)",
                "noise": "noise: uniform in the input range"}


def _seaborn():
    import seaborn

    return seaborn


def style(ax) -> None:
    """The one style of every axes: a light grid behind the data."""
    ax.grid(True, color="0.85", linewidth=0.6)
    ax.set_axisbelow(True)


def new_figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (3.6, 3.0), **kw):
    """``(fig, axes [nrows, ncols])`` on an Agg canvas, every axes styled (``style``)."""
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.asarray(fig.subplots(nrows, ncols, squeeze=False, **kw))
    for ax in axes.flat:
        style(ax)
    return fig, axes


def palette(names: Sequence[str]) -> dict[str, str]:
    """One colour per name, in order (the colorblind palette, cycled)."""
    return {name: COLORBLIND[i % len(COLORBLIND)] for i, name in enumerate(names)}



def _shown(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its ``predictor`` column by display name (``map`` -> ``MAP``)."""
    return df.assign(predictor=df["predictor"].map(predictor_label)) if "predictor" in df else df


def reliability_floor(bins: pd.DataFrame) -> float:
    """Where the reliability diagram's confidence axis starts: 0.5 when no test point has a max
    confidence below 1/2 (every binary predictor: the left half would be empty), else 0."""
    confidence = bins.loc[bins["count"] > 0, "confidence"]
    return 0.5 if len(confidence) and (confidence >= 0.5).all() else 0.0


def reliability_diagram(bins: pd.DataFrame, ece: dict[str, float] | None = None, title: str = "") -> Figure:
    """The predictors overlaid: accuracy against mean confidence per non-empty bin, with the
    diagonal of perfect calibration (top), and the number of test points per bin (bottom, log
    scale when a bin holds more than 100). The confidence axis starts at ``reliability_floor``.

    ``bins``: columns ``predictor, bin_center, accuracy, confidence, count``.
    """
    names = list(dict.fromkeys(bins["predictor"]))
    colors = palette(names)
    lo = reliability_floor(bins)
    fig, axes = new_figure(2, 1, size=(4.4, 2.4), sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    top, bottom = axes[0, 0], axes[1, 0]
    top.plot([lo, 1], [lo, 1], "k--", linewidth=0.8, label="perfect calibration")
    width = 1.0 / max(bins.groupby("predictor").size().max(), 1)
    for name in names:
        d = bins[(bins["predictor"] == name)]
        nonempty = d[d["count"] > 0]
        label = predictor_label(name) + ("" if ece is None or name not in ece else f" (ECE {100 * ece[name]:.2f}%)")
        top.plot(nonempty["confidence"], nonempty["accuracy"], marker="o", markersize=3.5, color=colors[name],
                 linewidth=1.4, label=label)
        bottom.step(d["bin_center"] + width / 2, d["count"], where="pre", color=colors[name], linewidth=1.2)
    accuracy = bins.loc[bins["count"] > 0, "accuracy"]
    y_lo = min(lo, np.floor(10 * accuracy.min()) / 10) if len(accuracy) else lo
    top.set(xlim=(lo, 1), ylim=(y_lo - 0.02, 1.02), ylabel="accuracy")  # room for points at the limits
    top.legend(loc="upper left", fontsize="small")
    bottom.set(xlim=(lo, 1), xlabel="confidence (bin mean)", ylabel="test points",
               yscale="log" if bins["count"].max() > 100 else "linear")
    if title:
        fig.suptitle(title)
    return fig


def confidence_histograms(conf: pd.DataFrame, title: str = "", captions: dict[str, str] | None = None,
                          n_classes: int | None = None) -> Figure:
    """One panel per predictor: the distribution of max-confidence per data set (test and OOD
    sets), as the fraction of each set's inputs per bin on a log scale (the pile-up near 1 does
    not flatten the rest). ``captions``: ``{dataset: its legend text}`` (e.g. what a generated set
    is); ``n_classes``: the x axis starts at ``1 / n_classes``, the lowest possible confidence.

    ``conf``: columns ``predictor, dataset, confidence``.
    """
    names = list(dict.fromkeys(conf["predictor"]))
    sets = list(dict.fromkeys(conf["dataset"]))
    colors = palette(sets)
    lo = 1.0 / n_classes if n_classes else 0.0
    edges = np.linspace(lo, 1.0, 21)
    fig, axes = new_figure(1, len(names), size=(3.8, 3.0), sharey=True)
    for j, name in enumerate(names):
        ax = axes[0, j]
        for ds in sets:
            c = conf[(conf["predictor"] == name) & (conf["dataset"] == ds)]["confidence"].to_numpy()
            if not len(c):
                continue
            counts, _ = np.histogram(np.clip(c, lo, 1.0), bins=edges)
            frac = np.maximum(counts / len(c), 1e-4)  # empty bins drawn at the axis floor
            label = (captions or {}).get(ds, ds)
            ax.stairs(frac, edges, color=colors[ds], linewidth=1.4, label=label, baseline=1e-4)
        ax.set(title=predictor_label(name), xlim=(lo, 1.0), yscale="log", ylim=(1e-4, 1.5),
               xlabel="max confidence", ylabel="fraction of the set" if j == 0 else None)
    handles, labels = axes[0, 0].get_legend_handles_labels()  # the same sets in every panel: one legend
    fig.legend(handles, labels, loc="outside lower center", fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def metric_curves(df: pd.DataFrame, x: str, metrics: Sequence[str], xlabel: str | None = None,
                  title: str = "", style: str | None = None) -> Figure:
    """One panel per classification metric: ``metric`` against ``x``, one line per predictor
    (``hue``), the y axis named by the metric's registered label (``metric_registry.label``:
    ``nll`` -> NLL)."""
    fig, axes = new_figure(1, len(metrics), size=(3.4, 2.8))
    df = _shown(df)
    names = list(dict.fromkeys(df["predictor"]))
    for j, m in enumerate(metrics):
        ax = axes[0, j]
        _seaborn().lineplot(df, x=x, y=m, hue="predictor", style=style, marker="o", palette=palette(names),
                     hue_order=names, ax=ax, legend=j == len(metrics) - 1)
        ax.set(xlabel=xlabel or x, ylabel=metric_label(m, "classification"))
    if title:
        fig.suptitle(title)
    return fig


def coverage_plot(df: pd.DataFrame, title: str = "") -> Figure:
    """Observed against nominal coverage of central intervals (``predictor, nominal, observed``);
    repeated ``(predictor, nominal)`` rows (e.g. seeds) are averaged."""
    fig, axes = new_figure(1, 1, size=(3.6, 3.4))
    ax = axes[0, 0]
    df = _shown(df)
    names = list(dict.fromkeys(df["predictor"]))
    colors = palette(names)
    for name in names:
        line = df[df["predictor"] == name].groupby("nominal", sort=True)["observed"].mean()
        ax.plot(line.index, line.to_numpy(), marker="o", color=colors[name], label=name)
    ax.legend(title="predictor", fontsize="small")
    ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="nominal coverage", ylabel="observed coverage", title=title)
    return fig
