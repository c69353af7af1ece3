"""Figures: reliability diagrams, confidence histograms, metric curves, regression coverage.

Every function takes long-format pandas frames and returns a ``matplotlib.figure.Figure`` on an
Agg canvas (no pyplot state, no display needed); ``report.Reporter`` saves it as PNG and sends it
to wandb. Histograms and metric curves are drawn with seaborn, imported on their first use (its
import, with scipy's, costs about 2 s); reliability diagrams and coverage plots use matplotlib
alone. No global theme is set: every figure gets the same light grid from ``new_figure``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# seaborn's "colorblind" palette (10 colours, cycled beyond)
COLORBLIND = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc",
              "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9")


def _seaborn():
    import seaborn

    return seaborn


def new_figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (3.6, 3.0), **kw):
    """``(fig, axes [nrows, ncols])`` on an Agg canvas."""
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.asarray(fig.subplots(nrows, ncols, squeeze=False, **kw))
    for ax in axes.flat:
        ax.grid(True, color="0.85", linewidth=0.6)
        ax.set_axisbelow(True)
    return fig, axes


def _palette(names: Sequence[str]) -> dict[str, str]:
    """One colour per name, in order (the colorblind palette, cycled)."""
    return {name: COLORBLIND[i % len(COLORBLIND)] for i, name in enumerate(names)}


def reliability_diagram(bins: pd.DataFrame, ece: dict[str, float] | None = None, title: str = "") -> Figure:
    """One column per predictor: accuracy per confidence bin against the diagonal (top) and the
    number of points per bin (bottom).

    ``bins``: columns ``predictor, bin_center, accuracy, confidence, count``.
    """
    names = list(dict.fromkeys(bins["predictor"]))
    colors = _palette(names)
    fig, axes = new_figure(2, len(names), size=(3.2, 2.6), sharex=True,
                           gridspec_kw={"height_ratios": [3, 1]})
    for j, name in enumerate(names):
        d = bins[bins["predictor"] == name]
        width = 1.0 / len(d)
        nonempty = d["count"] > 0
        top, bottom = axes[0, j], axes[1, j]
        top.bar(d["bin_center"], d["accuracy"].where(nonempty, 0.0), width=width, color=colors[name],
                edgecolor="black", linewidth=0.4, label="accuracy")
        top.bar(d["bin_center"][nonempty], (d["confidence"] - d["accuracy"])[nonempty],
                bottom=d["accuracy"][nonempty], width=width, color="none", edgecolor="crimson",
                hatch="//", linewidth=0.4, label="gap")
        top.plot([0, 1], [0, 1], "k--", linewidth=0.8)
        top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy" if j == 0 else None)
        label = name if ece is None or name not in ece else f"{name} (ECE {100 * ece[name]:.2f}%)"
        top.set_title(label)
        bottom.bar(d["bin_center"], d["count"], width=width, color=colors[name], edgecolor="black",
                   linewidth=0.4)
        bottom.set(xlim=(0, 1), yscale="log" if d["count"].max() > 100 else "linear",
                   xlabel="confidence", ylabel="count" if j == 0 else None)
    axes[0, 0].legend(loc="upper left", fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


def confidence_histograms(conf: pd.DataFrame, title: str = "") -> Figure:
    """One panel per predictor: histograms of max-confidence per dataset (in-distribution and OOD).

    ``conf``: columns ``predictor, dataset, confidence``.
    """
    names = list(dict.fromkeys(conf["predictor"]))
    fig, axes = new_figure(1, len(names), size=(3.6, 2.8), sharey=True)
    for j, name in enumerate(names):
        ax = axes[0, j]
        _seaborn().histplot(conf[conf["predictor"] == name], x="confidence", hue="dataset", stat="density",
                     common_norm=False, element="step", fill=False, bins=20, binrange=(0, 1), ax=ax,
                     legend=j == len(names) - 1)
        ax.set(title=name, xlim=(0, 1))
    if title:
        fig.suptitle(title)
    return fig


def metric_curves(df: pd.DataFrame, x: str, metrics: Sequence[str], xlabel: str | None = None,
                  title: str = "", style: str | None = None) -> Figure:
    """One panel per metric: ``metric`` against ``x``, one line per predictor (``hue``)."""
    fig, axes = new_figure(1, len(metrics), size=(3.4, 2.8))
    names = list(dict.fromkeys(df["predictor"]))
    for j, m in enumerate(metrics):
        ax = axes[0, j]
        _seaborn().lineplot(df, x=x, y=m, hue="predictor", style=style, marker="o", palette=_palette(names),
                     hue_order=names, ax=ax, legend=j == len(metrics) - 1)
        ax.set(xlabel=xlabel or x, ylabel=m)
    if title:
        fig.suptitle(title)
    return fig


def coverage_plot(df: pd.DataFrame, title: str = "") -> Figure:
    """Observed against nominal coverage of central intervals (``predictor, nominal, observed``);
    repeated ``(predictor, nominal)`` rows (e.g. seeds) are averaged."""
    fig, axes = new_figure(1, 1, size=(3.6, 3.4))
    ax = axes[0, 0]
    names = list(dict.fromkeys(df["predictor"]))
    colors = _palette(names)
    for name in names:
        line = df[df["predictor"] == name].groupby("nominal", sort=True)["observed"].mean()
        ax.plot(line.index, line.to_numpy(), marker="o", color=colors[name], label=name)
    ax.legend(title="predictor", fontsize="small")
    ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="nominal coverage", ylabel="observed coverage", title=title)
    return fig
