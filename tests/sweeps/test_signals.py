"""SIGTERM / SIGINT end a run or a sweep as a failure: the job is marked failed (``interrupted``) in
its ``status.json``, the sweep's ``summary.json`` is written, the exit status is 128 + the signal
number, and a relaunch runs the job again (``sweeps.signals``). The signal is sent by the process
to itself at a chosen point (``signal_app.py``): during training, under Lightning's loop and the
plain loop, and during the post-hoc Laplace fit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ENV, multirun, multirun_command, summary

APP = str(Path(__file__).with_name("signal_app.py"))
SMALL = ["data=toy2d", "data.n_train=64", "data.n_val=32", "data.n_test=32", "trainer.max_epochs=3",
         "data.batch_size=16", "logger=csv", "evaluation=none", "trainer.enable_progress_bar=false", "torch_num_threads=1"]


def _launch(tmp_path: Path, at: str, sig: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    cmd, sweep = multirun_command(tmp_path, *overrides, script=APP)
    env = {**os.environ, **ENV, "LAB_SIGNAL": sig, "LAB_SIGNAL_AT": at}
    env.pop("HYDRA_FULL_ERROR")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc, sweep


@pytest.mark.parametrize("at,sig,loop", [
    ("training", "TERM", "lightning"),
    ("laplace_fit", "TERM", "plain"),
    pytest.param("training", "INT", "plain", marks=pytest.mark.slow),
])
def test_a_signal_fails_the_job_writes_the_summary_and_exits_non_zero(tmp_path, at, sig, loop):
    overrides = (*SMALL, f"trainer.loop={loop}", "seed=0,1")
    proc, sweep = _launch(tmp_path, at, sig, *overrides)
    signum = {"TERM": signal.SIGTERM, "INT": signal.SIGINT}[sig]
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert f"Stopped by SIG{sig}" in proc.stderr
    s = summary(sweep)
    assert s["interrupted"] == f"SIG{sig}" and s["counts"] == {"finished": 0, "skipped": 0, "failed": 1, "unfinished": 0}
    job = sweep / s["failed"][0]["job"]
    status = json.loads((job / "status.json").read_text())
    assert status["state"] == "failed" and status["interrupted"] == f"SIG{sig}", status
    assert not (job / "metrics.json").exists()  # no evaluation ran after the signal
    assert not any(p.name == "status.json" and p.parent != job for p in sweep.rglob("status.json"))  # seed 1 not run
    if at != "training" or loop != "lightning":
        return
    # the relaunch (no signal) runs both jobs
    proc, again = multirun(tmp_path, *overrides)
    assert again == sweep and proc.returncode == 0, proc.stderr[-3000:]
    assert summary(sweep)["counts"]["finished"] == 2


def test_a_single_run_stopped_by_sigterm_exits_non_zero(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, APP, *SMALL, "trainer.loop=lightning", f"hydra.run.dir={out}"]
    env = {**os.environ, **ENV, "LAB_SIGNAL": "TERM", "LAB_SIGNAL_AT": "training"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert not (out / "metrics.json").exists()
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and status["interrupted"] == "SIGTERM"
