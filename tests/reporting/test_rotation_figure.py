"""The tables' ``shift_rotation`` figure: the rotated-test-set curves, mean over seeds with
standard-error bars (``table_figures.SeedCurves``), in the evaluation's figure style."""

from __future__ import annotations

import math

import pytest

from laplace_lab.reporting import figures as table_figures


def _job(path, acc_by_angle):
    (path / "tables").mkdir(parents=True)
    rows = ["predictor,angle,acc,nll,ece,conf"]
    rows += [f"{p},{a},{acc},{1 - acc},{0.1},{acc}" for p in ("map", "la") for a, acc in acc_by_angle.items()]
    (path / "tables" / "shift_rotation.csv").write_text("\n".join(rows) + "\n")
    return path


def test_seed_curves_mean_and_standard_error(tmp_path):
    jobs = [_job(tmp_path / "s0", {0: 0.99, 90: 0.30}), _job(tmp_path / "s1", {0: 0.97, 90: 0.40}),
            tmp_path / "no_table"]
    curves = table_figures.seed_curves(jobs, table_figures.TABLE_FIGURES["shift_rotation"])
    assert sorted(curves) == ["la", "map"] and sorted(curves["map"]) == [0.0, 90.0]
    mean, se = table_figures.mean_and_se([r["acc"] for r in curves["map"][90.0]])
    assert mean == pytest.approx(0.35) and se == pytest.approx(math.sqrt(0.005 / 2))
    assert table_figures.mean_and_se([0.5]) == (0.5, 0.0)

    out = table_figures.draw("shift_rotation", {"method_name=la": jobs}, tmp_path / "fig" / "shift_rotation.png")
    assert out is not None and out.stat().st_size > 0
    assert table_figures.draw("shift_rotation", {"g": [tmp_path / "no_table"]}, tmp_path / "x.png") is None
