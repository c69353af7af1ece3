"""Stop means stop: a stopped launch forwards the signal to the worker processes it started and
waits for them before it releases the sweep folder (``sweeps.children``); a worker that gets
SIGTERM marks its job ``interrupted`` and exits non-zero (``sweeps.signals.install_in_worker``),
instead of submitit's "Bypassing signal SIGTERM"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laplace_lab.sweeps import children, signals
from laplace_lab.sweeps.jobs import run_tracked
from laplace_lab.sweeps.signals import JobInterrupted

from .helpers import ENV, multirun_command, require_plugin

LONG = ["data=toy2d", "data.n_train=64", "data.n_val=32", "data.n_test=32", "data.batch_size=16", "logger=csv",
        "evaluation=none", "trainer.enable_progress_bar=false", "trainer.max_epochs=100000", "torch_num_threads=1"]

# A process that starts a child; each writes "<pid> <signal name>" into its file when a SIGTERM
# arrives and exits 143, unless IGNORE is set (then the child ignores SIGTERM).
TREE = """
import os, signal, subprocess, sys, time
out, ignore = sys.argv[1], sys.argv[2] == "1"
def handler(signum, frame):
    open(f"{out}.{os.getpid()}", "w").write(signal.Signals(signum).name)
    sys.exit(143)
if len(sys.argv) == 3:
    subprocess.Popen([sys.executable, __file__, out, sys.argv[2], "child"])
if ignore and len(sys.argv) == 4:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, handler)
open(f"{out}.ready.{os.getpid()}", "w").close()
time.sleep(600)
"""


def _tree(tmp_path: Path, ignore: bool) -> subprocess.Popen:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "got"), "1" if ignore else "0"])
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("got.ready.*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_the_signal_reaches_every_descendant_and_is_waited_for(tmp_path):
    proc = _tree(tmp_path, ignore=False)
    pids = children.descendants()
    assert proc.pid in pids and len(pids) >= 2
    assert children.stop_descendants(signal.SIGTERM, wait_s=30) == pids
    assert not any(children.alive(p) for p in pids)
    got = sorted(p.read_text() for p in tmp_path.glob("got.[0-9]*"))
    assert got == ["SIGTERM", "SIGTERM"]  # both handled the signal, neither was killed


def test_a_worker_that_ignores_it_is_killed_after_the_wait(tmp_path, caplog):
    _tree(tmp_path, ignore=True)
    pids = children.descendants()
    start = time.monotonic()
    children.stop_descendants(signal.SIGTERM, wait_s=1)
    assert time.monotonic() - start < 20 and not any(children.alive(p) for p in pids)
    assert "Killed (SIGKILL) 1 process(es) still running" in caplog.text


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in signals.HANDLED}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_worker_marks_its_job_and_exits_non_zero(tmp_path, monkeypatch, restore_handlers):
    """In a submitit task process (``SUBMITIT_FOLDER`` set, no entry-point wrapper)."""
    monkeypatch.setenv("SUBMITIT_FOLDER", str(tmp_path))
    monkeypatch.setitem(signals._state, "entry", False)

    def run(cfg, out):
        assert signal.getsignal(signal.SIGTERM) is signals._handler  # submitit's bypass replaced
        raise JobInterrupted(signal.SIGTERM)

    (tmp_path / "job").mkdir()
    (tmp_path / "job2").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        run_tracked(run, {}, tmp_path / "job")
    assert exit_info.value.code == 143
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert status["state"] == "failed" and status["interrupted"] == "SIGTERM"
    monkeypatch.delenv("SUBMITIT_FOLDER")  # the entry point's own process: the exception goes on
    with pytest.raises(JobInterrupted):
        run_tracked(run, {}, tmp_path / "job2")


@pytest.mark.slow  # a submitit_local launch: ~1 min on a loaded 2-core machine
def test_sigterm_to_a_submitit_launch_stops_its_worker_before_the_lock_is_released(tmp_path):
    require_plugin("hydra_plugins.hydra_submitit_launcher")
    cmd, sweep = multirun_command(tmp_path, "hydra/launcher=submitit_local", *LONG, "seed=0")
    env = {**os.environ, **ENV}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, job = time.monotonic() + 240, None
    while time.monotonic() < deadline and job is None:
        time.sleep(0.5)
        job = next((p.parent for p in sweep.glob("*/status.json")
                    if json.loads(p.read_text() or "{}").get("state") == "running"), None)
    assert job is not None, "the job never started"
    time.sleep(3)  # well into training
    worker = json.loads((job / "status.json").read_text())["pid"]
    os.kill(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 143, out[-3000:]
        assert not children.alive(worker)  # the lock is released only after the worker ended
    finally:  # a failed test leaves no training process behind
        proc.kill()
        if children.alive(worker):
            os.kill(worker, signal.SIGKILL)
    status = json.loads((job / "status.json").read_text())
    assert status["state"] == "failed" and status["interrupted"] == "SIGTERM", status
    assert json.loads((sweep / "summary.json").read_text())["interrupted"] == "SIGTERM"
