"""2-D toy classification: predictive contours of plug-in (MAP) vs Laplace predictives, zoomed in
on the data and zoomed out (as in Kristiadi et al. 2020, Fig. 1, and BayesLaplace.jl).

The zoomed-in box is the data's bounding box widened by ``margin`` times its range on each
side; the zoomed-out box has the same centre and ``zoom_out`` times the zoomed-in side lengths.
Far from the data a ReLU MAP network stays (over)confident while Laplace reverts towards 1/C.
Each figure: one panel per predictor (x axis the first input coordinate, y the second), the
training points on top, one legend for their classes below the panels, one colour bar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from laplace_lab.evaluation.labels import predictor_label
from laplace_lab.evaluation.plots import new_figure
from laplace_lab.evaluation.predict import predict_probs

# seaborn's "bright" palette (class colours of the scatter, cycled beyond 10 classes)
BRIGHT = ("#023eff", "#ff7c00", "#1ac938", "#e8000b", "#8b2be2",
          "#9f4800", "#f14cc1", "#a3a3a3", "#ffc400", "#00d7ff")
AXIS_LABELS = ("input $x_1$", "input $x_2$")  # the two input coordinates of the toy data


def _box(X: Tensor, margin: float, zoom: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = X.min(0).values.double().numpy(), X.max(0).values.double().numpy()
    span = np.maximum(hi - lo, 1e-6)
    lo, hi = lo - margin * span, hi + margin * span
    centre, half = (lo + hi) / 2, zoom * (hi - lo) / 2
    return centre - half, centre + half


def grid_values(predictors: dict[str, Callable], box: tuple[np.ndarray, np.ndarray], resolution: int,
                class_index: int | None = None, chunk_size: int = 4096, device="cpu"):
    """``(xx, yy, {name: values [res, res]})``: max-confidence or ``p(class_index)`` on a grid."""
    (x0, y0), (x1, y1) = box
    xx, yy = np.meshgrid(np.linspace(x0, x1, resolution), np.linspace(y0, y1, resolution))
    pts = torch.tensor(np.stack([xx.ravel(), yy.ravel()], 1), dtype=torch.float32)
    probs = predict_probs(predictors, pts, chunk_size, device)
    values = {}
    for name, p in probs.items():
        v = p.max(-1).values if class_index is None else p[:, class_index]
        values[name] = v.reshape(resolution, resolution).double().numpy()
    return xx, yy, values


def border_values(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The grid values on the border of the (zoomed-out) grid, ``[4 (resolution - 1)]`` per name."""
    return {name: np.concatenate([v[0], v[-1], v[1:-1, 0], v[1:-1, -1]]) for name, v in values.items()}


def _draw(xx, yy, values, X, y, class_index, n_classes, title) -> Figure:
    names = list(values)
    fig, axes = new_figure(1, len(names), size=(3.4, 3.0), sharex=True, sharey=True)
    lo = 0.0 if class_index is not None else 1.0 / n_classes
    levels = np.linspace(lo, 1.0, 11)
    palette = [BRIGHT[c % len(BRIGHT)] for c in range(n_classes)]
    markers = "osD^vP*X<>"
    X, y = X.numpy(), y.numpy()
    cs = None
    for j, name in enumerate(names):
        ax = axes[0, j]
        cs = ax.contourf(xx, yy, np.clip(values[name], lo, 1.0), levels=levels, cmap="viridis")
        for c in range(n_classes):
            m = y == c
            ax.scatter(X[m, 0], X[m, 1], s=9, color=palette[c], marker=markers[c % len(markers)],
                       edgecolor="black", linewidth=0.3, label=f"class {c} (training)")
        ax.set(title=predictor_label(name), xlim=(xx.min(), xx.max()), ylim=(yy.min(), yy.max()),
               xlabel=AXIS_LABELS[0], ylabel=AXIS_LABELS[1] if j == 0 else None)
    label = "max confidence" if class_index is None else f"p(class {class_index})"
    fig.colorbar(cs, ax=axes.ravel().tolist(), label=label, shrink=0.9, format="%.2f")
    handles, labels = axes[0, 0].get_legend_handles_labels()  # the same classes in every panel: one legend
    fig.legend(handles, labels, loc="outside lower center", ncols=min(n_classes, 5), fontsize="small",
               frameon=False)
    fig.suptitle(title)
    return fig


@dataclass(frozen=True)
class ContourGrid:
    """The grids the contours are drawn on (``evaluation.toy2d.*``).

    Args:
        resolution: points per side of each square grid (``resolution**2`` predictions per box).
        zoom_out: side lengths of the zoomed-out box over those of the zoomed-in one.
        margin: the zoomed-in box is the data's bounding box widened by ``margin`` times its range
            on each side.
        class_index: draw ``p(class_index)``; ``None`` draws the max confidence.
    """

    resolution: int = 150
    zoom_out: float = 10.0
    margin: float = 0.5
    class_index: int | None = None


def toy2d_contours(predictors: dict[str, Callable], X: Tensor, y: Tensor, grid: ContourGrid | None = None,
                   chunk_size: int = 4096, device="cpu", return_border: bool = False):
    """Contour figures ``{"toy2d_zoom_in": Figure, "toy2d_zoom_out": Figure}``.

    ``X``: ``[N, 2]`` inputs, ``y``: ``[N]`` labels (drawn on top); ``grid``: the boxes and what is
    drawn (default ``ContourGrid()``). With ``return_border`` also returns ``{name: the values on
    the zoomed-out grid's border}`` (``border_values``).
    """
    if X.ndim != 2 or X.shape[1] != 2:
        raise ValueError(f"toy2d_contours needs 2-D inputs [N, 2]; got {tuple(X.shape)}")
    grid = ContourGrid() if grid is None else grid
    resolution, zoom_out, margin, class_index = grid.resolution, grid.zoom_out, grid.margin, grid.class_index
    X, y = X.detach().cpu().float(), y.detach().cpu().long()
    figures, far = {}, {}
    n_classes = None
    for key, zoom in (("toy2d_zoom_in", 1.0), ("toy2d_zoom_out", zoom_out)):
        xx, yy, values = grid_values(predictors, _box(X, margin, zoom), resolution, class_index,
                                     chunk_size, device)
        if n_classes is None:
            probe = predict_probs(predictors, X[:1], 1, device)
            n_classes = max(int(y.max()) + 1, next(iter(probe.values())).shape[1])
        title = "zoomed in" if zoom == 1.0 else f"zoomed out (x{zoom:g})"
        figures[key] = _draw(xx, yy, values, X, y, class_index, n_classes, title)
        if zoom != 1.0:
            far = border_values(values)
    return (figures, far) if return_border else figures
