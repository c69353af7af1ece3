"""What a reader of a figure needs, checked on the matplotlib objects: axis labels and a class legend
on the toy contours, a reliability axis without an empty half, titles that name the run (seed,
swept values) without a one-word line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from laplace_lab.evaluation.labels import run_label
from laplace_lab.evaluation.plots import reliability_diagram
from laplace_lab.evaluation.report import Reporter, fill_balanced
from laplace_lab.evaluation.toy2d import AXIS_LABELS, ContourGrid, toy2d_contours

LAPLACE_CFG = {"seed": 3, "data": {"_target_": "laplace_lab.data.Toy2DDataModule", "kind": "moons"},
               "curvature": {"subset_of_weights": "last_layer", "hessian_structure": "kron", "type": "ggn"},
               "predictive": {"pred_type": "glm", "link_approx": "mc"}}


def _toy_figures(n_classes: int = 2):
    X = torch.randn(40, 2)
    y = torch.arange(40) % n_classes
    predictors = {"map": lambda z: torch.softmax(z @ torch.ones(2, n_classes), -1),
                  "la": lambda z: torch.softmax(0.1 * z @ torch.ones(2, n_classes), -1)}
    return toy2d_contours(predictors, X, y, ContourGrid(resolution=8))


@pytest.mark.parametrize("n_classes", [2, 3])
def test_toy_contours_have_axis_labels_and_a_class_legend(n_classes):
    for fig in _toy_figures(n_classes).values():
        panels = [ax for ax in fig.axes if ax.get_title()]  # the colour bar's axes has no title
        assert [ax.get_title() for ax in panels] == ["MAP", "Laplace"]
        assert all(ax.get_xlabel() == AXIS_LABELS[0] for ax in panels)
        assert panels[0].get_ylabel() == AXIS_LABELS[1]
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == [f"class {c} (training)" for c in range(n_classes)]


def _bins(confidence, accuracy, count):
    return pd.DataFrame({"predictor": "map", "bin_center": confidence, "confidence": confidence,
                         "accuracy": accuracy, "count": count})


def test_binary_reliability_axis_starts_at_one_half():
    fig = reliability_diagram(_bins([0.3, 0.55, 0.75, 0.95], [0.0, 0.5, 0.8, 0.97], [0, 10, 20, 400]))
    top, bottom = fig.axes
    assert top.get_xlim() == (0.5, 1.0) and bottom.get_xlim() == (0.5, 1.0)
    assert top.get_ylim()[0] == pytest.approx(0.48)  # the empty bin's accuracy (0) is not drawn


def test_reliability_axis_keeps_zero_when_a_point_is_below_one_half():
    fig = reliability_diagram(_bins([0.3, 0.75], [0.2, 0.8], [5, 20]))
    assert fig.axes[0].get_xlim() == (0.0, 1.0) and fig.axes[0].get_ylim()[0] == pytest.approx(-0.02)
    fig = reliability_diagram(_bins([0.55, 0.95], [0.32, 0.97], [5, 20]))  # a bin's accuracy below 1/2
    assert fig.axes[0].get_xlim() == (0.5, 1.0) and fig.axes[0].get_ylim()[0] == pytest.approx(0.28)


def test_title_lines_keep_short_words_with_their_line():
    label = "Laplace: last-layer KFAC-GGN, GLM predictive (MC)"
    lines = fill_balanced(label, 48).splitlines()
    assert len(lines) == 2 and all(len(line) >= 15 for line in lines)
    assert "(MC)" not in lines and lines[-1].endswith("predictive (MC)")
    assert fill_balanced(label, 80) == label
    assert "last-layer" in fill_balanced(label, 12)  # hyphenated names stay whole


def test_every_figure_names_the_seed_and_the_job(tmp_path):
    label = run_label(LAPLACE_CFG, "classification", True, ["data.kind=moons", "prior.prior_precision=0.1", "seed=3"])
    assert label == ("toy2d moons, seed 3; job: data.kind=moons, prior.prior_precision=0.1; "
                     "Laplace: last-layer KFAC-GGN, GLM predictive (MC)")
    assert run_label(LAPLACE_CFG, "classification", False) == "toy2d moons, seed 3"
    fig = Figure(figsize=(4.4, 3))
    fig.suptitle("reliability on the test set (15 bins)")
    Reporter(tmp_path, label=label).add_figure("reliability", fig)
    title = fig._suptitle.get_text().splitlines()
    assert title[0] == "toy2d moons, seed 3" and title[-1] == "reliability on the test set (15 bins)"
    assert "job: data.kind=moons, prior.prior_precision=0.1" in title and "GLM predictive (MC)" in title
