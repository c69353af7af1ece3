"""Figures of a ``landscape.Landscape``: the 1-D slices, the 2-D loss and test-metric slice, and
the 2-D likelihood ``exp(-(E - E_MAP))`` beside the Laplace Gaussian and their difference.

Every axis is in units of its direction (``a = 1``: the MAP plus the direction); the MAP is the
red star at the origin; titles name the dataset, the Laplace (subset, structure, curvature), the
directions and the rows the loss and metric were computed on.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from laplace_lab.evaluation.landscape import Landscape
from laplace_lab.evaluation.plots import COLORBLIND, new_figure

CURVATURE_NAMES = {"ggn": "GGN", "ef": "EF", "mc_fisher": "MC-Fisher"}
SUBSET_NAMES = {"all": "all-weights", "last_layer": "last-layer"}
LOSS_LABEL = "loss E / N (tempered mean NLL + prior / N)"


def laplace_name(ls: Landscape) -> str:
    """E.g. ``last-layer kron Laplace (GGN)``."""
    return (f"{SUBSET_NAMES.get(ls.subset, ls.subset)} {ls.structure} Laplace "
            f"({CURVATURE_NAMES.get(ls.curvature, ls.curvature)})")


def suptitle(ls: Landscape, dataset: str | None) -> str:
    rows = f"{ls.n_rows} of {ls.n_data}" if ls.n_rows != ls.n_data else f"all {ls.n_data}"
    kind = "filter-normalised random directions" if ls.kind == "random" else "curvature eigen-directions"
    return (f"{dataset or 'data'}: {laplace_name(ls)}, {kind}\n"
            f"loss on {rows} training rows, test {ls.metric_name} on {ls.n_test} test rows")


def axis_label(ls: Landscape, i: int) -> str:
    return f"a{i + 1} (units of d{i + 1}: {ls.labels[i]})"


def _mark_map(ax, x=0.0, y=0.0, label=True) -> None:
    ax.plot([x], [y], marker="*", color="red", markersize=13, markeredgecolor="black", linestyle="none",
            label="MAP" if label else None, zorder=5)


def _peak_one(log_density: np.ndarray) -> np.ndarray:
    """``exp(log_density)`` divided by its largest value (the shapes of two slices side by side, whatever
    their heights relative to the MAP)."""
    return np.exp(log_density - log_density.max())


def figure_1d(ls: Landscape, dataset: str | None = None) -> Figure:
    """Left column: loss (top) and test metric (bottom) along every direction. Then one column per
    direction on its own, narrower grid: the likelihood slice (solid) against the Laplace Gaussian
    (dashed), as densities each divided by its largest grid value (top: their shapes) and as log
    densities relative to the MAP (bottom: where a MAP off the slice's mode and a curvature mismatch
    show however far apart the heights are)."""
    k = len(ls.one_d)
    fig, axes = new_figure(2, 1 + k, size=(3.9, 3.0))
    loss_ax, metric_ax = axes[0, 0], axes[1, 0]
    for i, g in enumerate(ls.one_d):
        color = COLORBLIND[i % len(COLORBLIND)]
        loss_ax.plot(g.axes[0], g.values["loss"], color=color, label=f"d{i + 1}: {ls.labels[i]}")
        metric_ax.plot(g.axes[0], g.values["metric"], color=color, label=f"d{i + 1}")
    _mark_map(loss_ax, 0.0, ls.energy_map / ls.n_data)
    _mark_map(metric_ax, 0.0, ls.metric_map)
    lo, hi = (f([f(g.values["loss"]) for g in ls.one_d]) for f in (np.nanmin, np.nanmax))
    if lo > 0 and hi > 10 * lo:
        loss_ax.set_yscale("log")
    loss_ax.set(xlabel="a (units of each direction)", ylabel=LOSS_LABEL, title="training loss")
    metric_ax.set(xlabel="a (units of each direction)", ylabel=f"test {ls.metric_name}",
                  title=f"test {ls.metric_name}")
    loss_ax.legend(fontsize=6)
    metric_ax.legend(fontsize=6)
    for i, g in enumerate(ls.post_one_d):
        color, a = COLORBLIND[i % len(COLORBLIND)], g.axes[0]
        probe = f"curvature ratio {ls.curvature_ratio[i]:.3f}, offset {ls.offset_std[i]:.2f} std"
        log_lik, log_gauss = -g.values["delta"], g.values["log_gauss"]
        for row, (lik, gauss, ylabel) in enumerate((
                (_peak_one(log_lik), _peak_one(log_gauss), "density / its largest grid value"),
                (log_lik, log_gauss, "log density relative to the MAP"))):
            ax = axes[row, 1 + i]
            ax.plot(a, lik, color=color, label="likelihood exp(-(E - E_MAP))" if row == 0 else "-(E - E_MAP)")
            ax.plot(a, gauss, color="black", linestyle="--",
                    label=f"Laplace Gaussian ({ls.structure})" if row == 0 else "log Gaussian")
            _mark_map(ax, 0.0, float(lik[np.argmin(np.abs(a))]) if row == 0 else 0.0)
            ax.set(xlabel=axis_label(ls, i), ylabel=ylabel)
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.legend(fontsize=6)
        axes[0, 1 + i].set_title(f"along d{i + 1}: {probe}", fontsize=8)
    fig.suptitle(f"{suptitle(ls, dataset)}; likelihood grids: {ls.posterior_grid}", fontsize=9)
    return fig


def _loss_levels(values: np.ndarray):
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    if lo > 0 and hi > lo:
        return np.geomspace(lo, hi, 21), LogNorm(lo, hi)
    return np.linspace(lo, hi if hi > lo else lo + 1e-12, 21), None


def figure_2d(ls: Landscape, dataset: str | None = None) -> Figure:
    """The loss over the 2-D slice (filled contours), and the test metric (filled) under the loss
    contour lines."""
    g = ls.two_d
    a, b = g.axes
    A, B = np.meshgrid(a, b, indexing="ij")
    fig, axes = new_figure(1, 2, size=(4.6, 3.9))
    levels, norm = _loss_levels(g.values["loss"])
    cs = axes[0, 0].contourf(A, B, g.values["loss"], levels=levels, norm=norm, cmap="viridis")
    fig.colorbar(cs, ax=axes[0, 0], label=LOSS_LABEL, format="%.3g", ticks=levels[::4])
    axes[0, 0].set(title="training loss")
    cm = axes[0, 1].contourf(A, B, g.values["metric"], levels=21, cmap="magma")
    fig.colorbar(cm, ax=axes[0, 1], label=f"test {ls.metric_name}", format="%.3g")
    lines = axes[0, 1].contour(A, B, g.values["loss"], levels=levels[::4], norm=norm, colors="white",
                               linewidths=0.7)
    axes[0, 1].clabel(lines, fontsize=6, fmt="%.2g")
    axes[0, 1].set(title=f"test {ls.metric_name} (white: loss contours)")
    for n, ax in enumerate(axes.flat):
        _mark_map(ax, label=n == 0)
        ax.set(xlabel=axis_label(ls, 0), ylabel=axis_label(ls, 1))
    fig.legend(loc="outside lower center", fontsize=8)
    fig.suptitle(suptitle(ls, dataset), fontsize=9)
    return fig


def figure_posterior(ls: Landscape, dataset: str | None = None) -> Figure:
    """Top: ``exp(-(E - E_MAP))`` and the Laplace Gaussian on the same slice, each divided by its
    largest grid value (their shapes; the total variation compares them so), and the difference.
    Bottom: the log densities relative to the MAP (shared colour scale for the two log densities, clipped below at the Gaussian's
    smallest grid value minus its range). The likelihood's largest grid value is the white X
    (off the MAP where the loss's gradient there is not 0)."""
    g = ls.post_two_d
    a, b = g.axes
    A, B = np.meshgrid(a, b, indexing="ij")
    log_lik, log_gauss = -g.values["delta"], g.values["log_gauss"]
    lik, gauss = _peak_one(log_lik), _peak_one(log_gauss)
    fig, axes = new_figure(2, 3, size=(4.3, 3.6), sharex=True, sharey=True)
    span = float(log_gauss.max() - log_gauss.min())
    log_lo = min(float(log_gauss.min()) - span, 0.0)
    log_hi = max(float(log_lik.max()), float(log_gauss.max()), 0.0)
    rows = ((lik, gauss, np.linspace(0.0, 1.0, 21), "density / its largest grid value", "viridis"),
            (np.clip(log_lik, log_lo, None), log_gauss, np.linspace(log_lo, log_hi, 21),
             "log density relative to the MAP (0 there)", "cividis"))
    names = (("likelihood exp(-(E - E_MAP))", f"Laplace Gaussian: {laplace_name(ls)}", "likelihood - Gaussian"),
             ("-(E - E_MAP)", "log Gaussian", "-(E - E_MAP) - log Gaussian"))
    for r, (first, second, levels, label, cmap) in enumerate(rows):
        for c, values in enumerate((first, second)):
            cs = axes[r, c].contourf(A, B, values, levels=levels, cmap=cmap, extend="min" if r else "neither")
            axes[r, c].set_title(names[r][c], fontsize=8)
        fig.colorbar(cs, ax=axes[r, :2].tolist(), label=label, format="%.3g", shrink=0.9)
        diff = first - second if r == 0 else log_lik - log_gauss
        edge = max(float(np.abs(diff).max()), 1e-12)
        cd = axes[r, 2].contourf(A, B, diff, levels=np.linspace(-edge, edge, 21), cmap="RdBu_r")
        fig.colorbar(cd, ax=axes[r, 2], label="difference", format="%.3g", shrink=0.9,
                     ticks=np.linspace(-edge, edge, 5))
        axes[r, 2].set_title(names[r][2] + (f" (total variation {ls.total_variation():.3f})" if r == 0 else ""),
                             fontsize=8)
    i, j = np.unravel_index(np.argmax(log_lik), log_lik.shape)
    for n, ax in enumerate(axes.flat):
        _mark_map(ax, label=n == 0)
        ax.plot([a[i]], [b[j]], marker="X", color="white", markeredgecolor="black", markersize=10,
                markeredgewidth=1, linestyle="none", label="likelihood's largest grid value" if n == 0 else None,
                zorder=6)
    fig.legend(loc="outside lower center", ncol=2, fontsize=8, facecolor="0.8")
    for ax in axes[1]:
        ax.set(xlabel=axis_label(ls, 0))
        ax.xaxis.set_major_locator(MaxNLocator(5))
    for ax in axes[:, 0]:
        ax.set(ylabel=axis_label(ls, 1))
    fig.suptitle(f"{suptitle(ls, dataset)}; grid: {ls.posterior_grid}", fontsize=9)
    return fig
