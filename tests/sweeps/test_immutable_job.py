"""A finished job whose folder cannot be written (read-only, or ``chattr +i``: a protected result) is
skipped by a relaunch with a warning, not a traceback that aborts the sweep."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess

import pytest

from laplace_lab.sweeps import jobs, status
from laplace_lab.sweeps.callback import summarize

from .helpers import TINY, multirun, summary


def test_a_skip_that_cannot_be_recorded_is_a_warning(tmp_path, monkeypatch, caplog):
    status.write_status(tmp_path, state="finished")

    def refuse(path, data, **kw):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(status, "write_json_atomic", refuse)
    with caplog.at_level(logging.WARNING):
        jobs.record_skip(tmp_path, "L2")
    assert f"Skipped finished job in {tmp_path}, but could not record the skip in its status.json" in caplog.text
    assert "PermissionError" in caplog.text
    assert status.read_status(tmp_path) == {"state": "finished"}


def test_the_summary_counts_a_skip_that_could_not_be_stamped(tmp_path, monkeypatch):
    sweep, job = tmp_path / "multirun", tmp_path / "multirun" / "seed=0"
    job.mkdir(parents=True)
    status.write_status(job, state="finished", last_launch_id="L1")
    monkeypatch.setattr(status, "write_json_atomic", lambda path, data, **kw: (_ for _ in ()).throw(
        PermissionError(1, "Operation not permitted", str(path))))
    jobs.record_skip(job, "L2", sweep)
    s = summarize(sweep, "L2")
    assert s["counts"] == {"finished": 0, "skipped": 1, "failed": 0, "unfinished": 0}
    assert s["skipped"] == s["skipped_immutable"] == ["seed=0"]
    assert summarize(sweep, "L3")["skipped_immutable"] == []  # another launch's skips are not this one's
    line = json.loads((sweep / status.IMMUTABLE_SKIPS).read_text())
    assert line["job"] == "seed=0" and line["error"].startswith("PermissionError")


def _immutable(path) -> bool:
    """``chattr +i path`` where the user and the file system allow it."""
    if shutil.which("chattr") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


@pytest.mark.slow  # two multiruns (~13 s); the unit test above covers the skip
def test_relaunch_over_an_immutable_finished_job(tmp_path):
    proc, sweep = multirun(tmp_path, *TINY, "seed=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p for p in sweep.iterdir() if p.is_dir() and "seed=0" in p.name]
    if not _immutable(job):
        pytest.skip("chattr +i is not available here (needs root and a file system that supports it)")
    try:
        proc, again = multirun(tmp_path, *TINY, "seed=0")
    finally:
        subprocess.run(["chattr", "-i", str(job)], check=True)
    assert again == sweep and proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "could not record the skip in its status.json" in output
    # the marker could not be stamped with this launch: the sweep folder notes the skip, the summary counts it
    s = summary(sweep)
    assert s["counts"] == {"finished": 0, "skipped": 1, "failed": 0, "unfinished": 0}, s
    assert s["skipped"] == s["skipped_immutable"] == [job.name]
