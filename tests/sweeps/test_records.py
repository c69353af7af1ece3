"""``python -m laplace_lab.sweeps.records``: a sweep's finished jobs saved without machine paths,
restored on another output root, and skipped by the relaunch there."""

from __future__ import annotations

import json
import shutil

import pytest

from laplace_lab.reporting import tables
from laplace_lab.sweeps import records
from laplace_lab.sweeps.status import REPO_ROOT

from .helpers import TINY, multirun, summary


def test_scrub_gives_a_root_inside_another_its_own_token():
    roots = {"<repo>": "/m/lab", "<output_root>": "/m/lab/outputs/x", "<data_dir>": "/d"}
    text = "cwd /m/lab, dir /m/lab/outputs/x/exp/job, data /d/MNIST"
    assert records.scrub(text, roots.items()) == "cwd <repo>, dir <output_root>/exp/job, data <data_dir>/MNIST"


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
def test_save_then_restore_elsewhere_and_the_relaunch_skips_them(tmp_path, monkeypatch):
    data_dir = tmp_path / "machine_data"
    data_dir.mkdir()
    monkeypatch.setenv("LAPLACE_LAB_DATA_DIR", str(data_dir))
    overrides = (*TINY, "seed=0,1", "checkpoint.enabled=true")
    first = tmp_path / "first"
    first.mkdir()
    proc, sweep = multirun(first, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep / "half_done").mkdir()  # an unfinished job is not recorded
    (sweep / "half_done" / "status.json").write_text(json.dumps({"state": "running"}))

    saved = records.save(first / "out", tmp_path / "records")
    assert len(saved) == 2
    files = [p for p in (tmp_path / "records").rglob("*") if p.is_file()]
    assert not any(p.suffix == ".ckpt" or "checkpoints" in p.parts for p in files)
    assert not any("half_done" in p.parts for p in files)
    names = {p.name for p in files}
    assert {"status.json", "metrics.json", "overrides.yaml", "hydra.yaml", "config_resolved.yaml",
            "launches.jsonl"} <= names
    for p in files:  # no path of the machine that ran them (its checkout, cwd, data, outputs)
        text = p.read_text()
        assert str(tmp_path) not in text and str(REPO_ROOT) not in text, p
    assert "<output_root>" in (next(p for p in files if p.name == "config_resolved.yaml")).read_text()

    second = tmp_path / "second"
    copied, kept = records.restore(tmp_path / "records", second / "out")
    assert copied == len(files) and kept == 0
    assert records.restore(tmp_path / "records", second / "out") == (0, len(files))

    proc, sweep2 = multirun(second, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(sweep2)["counts"] == {"finished": 0, "skipped": 2, "failed": 0, "unfinished": 0}
    before = {r.path.name: r.metrics for r in tables.load_runs([sweep]).runs}
    after = {r.path.name: r.metrics for r in tables.load_runs([sweep2]).runs}
    assert after == before and len(after) == 2

    # A relaunch cut off before its jobs ran: the jobs are restored records (placeholders only; Hydra
    # rewrote their .hydra/ files, so put the records' back), but the multirun's own files name the
    # second machine's folders. Saving again scrubs those too.
    for job in sweep2.iterdir():
        if (job / ".hydra").is_dir():
            shutil.rmtree(job / ".hydra")
    records.restore(tmp_path / "records", second / "out")
    assert str(second) in (sweep2 / "multirun.yaml").read_text()
    assert len(records.save(second / "out", tmp_path / "records2")) == 2
    files2 = [p for p in (tmp_path / "records2").rglob("*") if p.is_file()]
    assert {"multirun.yaml", "launches.jsonl"} <= {p.name for p in files2}
    for p in files2:
        assert str(tmp_path) not in p.read_text(), p


def test_missing_folders_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        records.save(tmp_path / "nope", tmp_path / "rec")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        records.restore(tmp_path / "nope", tmp_path / "out")
