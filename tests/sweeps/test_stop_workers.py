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

from laplace_lab.sweeps import children, lock, signals
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


def _start_and_stop(tmp_path: Path, *overrides: str, running: int = 1) -> tuple[subprocess.Popen, str, Path, list[int]]:
    """Launch a long multirun, wait until ``running`` of its jobs train, send the launcher SIGTERM and
    wait for it; returns (the process, its output, the sweep folder, the jobs' worker pids)."""
    cmd, sweep = multirun_command(tmp_path, *overrides, *LONG)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline, jobs = time.monotonic() + 240, []
    while time.monotonic() < deadline and len(jobs) < running and proc.poll() is None:
        time.sleep(0.5)
        jobs = [p.parent for p in sweep.glob("*/status.json") if json.loads(p.read_text() or "{}").get("state") == "running"]
    workers = [json.loads((job / "status.json").read_text())["pid"] for job in jobs]
    try:
        assert len(jobs) == running, f"{len(jobs)} of {running} jobs started"
        time.sleep(3)  # well into training
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
        return proc, out, sweep, workers
    finally:  # a failed test leaves no training process behind
        proc.kill()
        for pid in workers:
            if children.alive(pid):
                os.kill(pid, signal.SIGKILL)


def _assert_stopped(proc: subprocess.Popen, out: str, sweep: Path, workers: list[int], jobs: int) -> None:
    assert proc.returncode == 143, out[-3000:]
    assert not any(children.alive(pid) for pid in workers)  # the lock is released only after the workers ended
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["counts"]["failed"] == jobs, summary
    for job in sweep.glob("*/status.json"):
        status = json.loads(job.read_text())
        assert status["state"] == "failed" and status["interrupted"] == "SIGTERM", status
    lock.release(lock.acquire(sweep, {"pid": os.getpid()}))  # free for the next launch


@pytest.mark.slow  # a submitit_local launch: ~1 min on a loaded 2-core machine
def test_sigterm_to_a_submitit_launch_stops_its_worker_before_the_lock_is_released(tmp_path):
    require_plugin("hydra_plugins.hydra_submitit_launcher")
    _assert_stopped(*_start_and_stop(tmp_path, "hydra/launcher=submitit_local", "seed=0"), jobs=1)


def test_a_deferred_signal_is_raised_from_python_code(restore_handlers):
    """What the Ray driver waits under: a signal is recorded (nothing raised inside foreign code),
    ``raise_pending`` raises it, and the handlers of before come back."""
    before = signal.getsignal(signal.SIGTERM)
    with signals.deferred():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as ray.init does
        signals.reinstall()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        with pytest.raises(JobInterrupted) as info:
            signals.raise_pending()
        assert info.value.signum == signal.SIGTERM
        signals.raise_pending()  # once
    assert signal.getsignal(signal.SIGTERM) is before


def test_hydra_builds_the_stoppable_ray_launcher():
    """Hydra loads its plugins a second time when it scans them: the class it instantiates is patched."""
    require_plugin("hydra_plugins.hydra_ray_launcher")
    from hydra.core.plugins import Plugins

    from laplace_lab.sweeps import ray_launch

    assert ray_launch.patch_ray_launcher()
    cls = Plugins.instance().class_name_to_class[ray_launch.CLASS]
    assert cls.launch.__doc__ == ray_launch.launch.__doc__


@pytest.mark.slow  # a local Ray node and two workers: ~1 min on a loaded 2-core machine
def test_sigterm_to_a_ray_launch_marks_every_job_and_writes_the_summary(tmp_path):
    """Ray's driver used to abort (exit -6, no summary.json) or hang in ray.get: now both jobs are
    marked interrupted by their workers, the summary is written and the launch exits 143."""
    require_plugin("hydra_plugins.hydra_ray_launcher")
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[launchers]')")
    run = _start_and_stop(tmp_path, "hydra/launcher=ray", "hydra.launcher.ray.init.num_cpus=2", "seed=0,1", running=2)
    _assert_stopped(*run, jobs=2)
