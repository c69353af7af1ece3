"""A finished job whose folder cannot be written (read-only, or ``chattr +i``: a protected result) is
skipped by a relaunch with a warning, not a traceback that aborts the sweep."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest

from laplace_lab.sweeps import jobs, status

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
    # the marker could not be stamped with this launch: summary.json counts the job under its own launch
    assert summary(sweep)["counts"] == {"finished": 0, "skipped": 0, "failed": 0, "unfinished": 0}
