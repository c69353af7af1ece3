"""Tables that say what they leave out and never destroy a committed table: failed and unfinished
jobs named with why, metric names escaped, huge integers handled, nothing under ``results/``
without ``--commit-results``, a committed table replaced by a smaller one only when asked, stale
figures removed, the three files written whole."""

from __future__ import annotations

import json
import os

import pytest

from laplace_lab.io import atomic
from laplace_lab.reporting import table_commit, tables
from laplace_lab.reporting.table_commit import ShrinkingTable
from laplace_lab.reporting.table_spec import Admission, TableSpec

from .test_tables import make_job, preset_t, read_csv, repo, sweep  # noqa: F401


def test_failed_and_unfinished_jobs_are_named_with_why(sweep, tmp_path):  # noqa: F811
    failed = next(sweep.glob("*curvature=full*seed=0*"))
    status = json.loads((failed / "status.json").read_text())
    (failed / "status.json").write_text(json.dumps({**status, "error": "RuntimeError: boom"}))
    md = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]))[0].read_text()
    section = md.split("## Jobs left out (not finished)")[1]
    assert f"`multirun/{failed.name}`: failed (RuntimeError: boom)" in section
    assert "seed=1`: unfinished (state running: still running, or killed before its end)" in section


def test_metric_names_and_cells_are_escaped(tmp_path):
    folder = tmp_path / "multirun"
    for seed in (0, 1):
        make_job(folder, "mlp", "kron", seed, {"test/a|b": 0.5, "test/<b>x</b>": 1.0})
    md = tables.aggregate([folder], "t")[0].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert header.count(" | ") == 4 and "test/a\\|b" in header and "&lt;b&gt;x&lt;/b&gt;" in header
    assert "<b>" not in md


def test_a_huge_integer_is_left_out_as_non_finite(tmp_path):
    folder = tmp_path / "multirun"
    make_job(folder, "mlp", "kron", 0, {"test/map/acc": 0.5})
    job = make_job(folder, "mlp", "kron", 1, {"test/map/acc": 0.7})
    (job / "metrics.json").write_text('{"test/map/acc": ' + "9" * 400 + "}")
    md = tables.aggregate([folder], "t", spec=TableSpec(metrics=["test/map/acc"]))[0].read_text()
    assert "0.5000 (n=1; 1 non-finite left out)" in md and "test/map/acc = inf" in md


def test_results_subfolders_need_commit_results(sweep, repo):  # noqa: F811
    with pytest.raises(ValueError, match="holds the committed tables: write there only with --commit-results"):
        tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]), results_dir=repo / "results" / "sub")
    assert not (repo / "results").exists()


def test_commit_results_refuses_a_smaller_table_and_removes_stale_figures(sweep, tmp_path, repo, preset_t):  # noqa: F811
    commit = {"commit_results": True, "preset": preset_t, "admission": Admission(allow_mixed=True)}
    full = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"], figures=["reliability"]), **commit)
    figures = repo / "results" / "t_figures"
    assert sorted(p.name for p in figures.iterdir()) == ["model=lenet,curvature=diag__reliability.png",
                                                         "model=mlp,curvature=kron__reliability.png"]
    (figures / "other.png").write_bytes(b"not ours")
    before = {p: p.read_text() for p in full}
    # a one-seed, one-method launch: fewer jobs, seeds and rows
    small = tmp_path / "small" / "multirun"
    make_job(small, "mlp", "kron", 0, {"test/map/acc": 0.1})
    with pytest.raises(ShrinkingTable, match=r"by a smaller table: 1 jobs \(the committed table has 5\); seeds missing: "
                                             r"seed=1, seed=2; rows missing: model=lenet,curvature=diag"):
        tables.aggregate([small], "t", spec=TableSpec(metrics=["test/map/acc"], figures=["reliability"]), **commit)
    assert {p: p.read_text() for p in full} == before  # nothing written
    cli = [str(small), "--preset", "t", "--allow-mixed", "--metrics", "test/map/acc", "--commit-results", "--figures",
           "reliability"]  # (--allow-mixed: the stand-in preset is in no commit)
    with pytest.raises(SystemExit, match="--allow-smaller"):
        tables.main(cli)
    tables.main([*cli, "--allow-smaller"])
    assert [r["n"] for r in read_csv(repo / "results" / "t.csv")] == ["1"]
    assert sorted(p.name for p in figures.iterdir()) == ["model=mlp,curvature=kron__reliability.png", "other.png"]
    # the same or a bigger table replaces it without the flag
    tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]), **commit)


def test_the_three_files_are_written_whole(sweep, tmp_path, monkeypatch):  # noqa: F811
    """A write that dies while the files are written leaves the old files, not cut-off ones, and no
    temporary file."""
    paths = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]))
    old = {p: p.read_text() for p in paths}
    calls = {"n": 0}
    real = atomic._fsync

    def dies_on_the_second(path):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        real(path)

    monkeypatch.setattr(atomic, "_fsync", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]))
    assert {p: p.read_text() for p in paths} == old
    assert not [p for p in sweep.iterdir() if p.name.endswith(".tmp") or p.name.endswith(".writing.json")]


def test_the_three_files_become_visible_together(sweep, tmp_path, monkeypatch):  # noqa: F811
    """``kill -9`` between two renames (simulated: the process stops after the first): the journal
    stays, and the next reader (``committed_shape``, a table write) completes the set, so no new
    ``.md`` is ever read beside an old ``.csv``."""
    paths = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]))
    real = os.replace
    calls = {"n": 0}

    def killed_after_the_first_rename(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:  # 1: the journal itself, 2: the .md, 3: the .csv
            raise SystemExit("killed")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", killed_after_the_first_rename)
    with pytest.raises(SystemExit):
        tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]))
    monkeypatch.setattr(atomic.os, "replace", real)
    journal = table_commit.table_journal(sweep, "t")
    assert journal.is_file() and "test/la/nll" in paths[0].read_text()  # the new .md, beside
    assert "test/la/nll" not in paths[1].read_text()  # the old .csv: the state a reader must not see
    shape = table_commit.committed_shape(sweep, "t")  # a reader: completes the write first
    assert not journal.exists() and shape is not None
    assert all("test/la/nll" in p.read_text() for p in paths)
    assert not [p for p in sweep.iterdir() if p.name.endswith(".tmp")]


def test_the_refusal_of_dirty_jobs_says_a_relaunch_skips_them(sweep, repo):  # noqa: F811
    job = next(p.parent for p in sweep.rglob("status.json") if json.loads(p.read_text())["state"] == "finished")
    status = json.loads((job / "status.json").read_text())
    (job / "status.json").write_text(json.dumps({**status, "git": {**status["git"], "dirty": True}}))
    with pytest.raises(tables.ProvenanceError, match=r"a relaunch skips finished jobs: launch into a new folder"):
        tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]))
