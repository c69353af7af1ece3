"""Sweeps that are safe to launch twice: the folder lock, per-launch bookkeeping, run-only keys
kept out of folder names, one folder per sweep command (issues 17 items 3 and 5, 21 item 2)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from laplace_lab.sweeps import lock
from laplace_lab.sweeps.callback import SweepSummary
from laplace_lab.sweeps.run_only import (
    RUN_ONLY_KEYS,
    RUN_ONLY_SUBKEYS,
    is_run_only,
    job_dirname,
    normalize_value,
    normalized_overrides,
    sweep_dirname,
)
from laplace_lab.sweeps.status import RUN_ONLY_SUBKEYS as STATUS_SUBKEYS
from laplace_lab.sweeps.status import config_fingerprint, read_launches, read_status
from tests.conftest import compose_config
from tests.sweeps.helpers import ENV, TINY, multirun, multirun_command, summary

SWEEP = [*TINY, "seed=0,1,2"]


def test_run_only_keys_stay_out_of_names_and_values_are_normalised():
    assert STATUS_SUBKEYS is RUN_ONLY_SUBKEYS and "torch_num_threads" in RUN_ONLY_KEYS  # one list
    for key in ("torch_num_threads", "+torch_num_threads", "logger", "logger.wandb.enabled", "paths.output_root",
                "trainer.enable_progress_bar", "checkpoint.dirpath", "checkpoint.resume_from", "experiment",
                "hydra/launcher", "map_cache.enabled", "aggregate.name", "data.data_dir"):
        assert is_run_only(key), key
    for key in ("seed", "trainer.max_epochs", "data", "data.name", "prior.prior_precision", "model@m", "paths_x"):
        assert not is_run_only(key), key
    base = job_dirname(["seed=1", "prior.prior_precision=1"])
    assert base == "prior.prior_precision=1,seed=1"
    assert job_dirname(["prior.prior_precision=1.0", "seed=1", "torch_num_threads=4", "logger.wandb.enabled=false",
                        "paths.output_root=/x/y", "experiment=toy2d"]) == base
    assert job_dirname(["prior.prior_precision=1e0", "seed=1.0"]) == base
    assert job_dirname(["optimizer.lr=1e-3"]) == "optimizer.lr=0.001" != job_dirname(["optimizer.lr=1e-2"])
    assert normalized_overrides(["f=0,1", "e=abc", "d=[1,2]", "c=1e-3", "b=1.0", "a=1", "paths.output_root=/x"]) == [
        "a=1", "b=1", "c=0.001", "d=[1,2]", "e=abc", "f=0,1"]
    assert normalize_value(True) is True and normalize_value(0.5) == 0.5 and normalize_value("1.0") == "1.0"
    assert job_dirname([]) == "default" and "/" not in job_dirname(["data=a/b"])
    long = job_dirname(["x=" + "y" * 500])
    assert len(long) <= 200 and long != job_dirname(["x=" + "y" * 499])
    # Sweep folders: one per command; a preset's own sweep keeps .../multirun.
    assert sweep_dirname(["experiment=redux_mnist", "torch_num_threads=2"]) == "multirun"
    assert sweep_dirname(["seed=0,1", "prior.prior_precision=1.0"]) == "multirun_prior.prior_precision=1,seed=0,1"
    assert sweep_dirname(["seed=0,1"]) != sweep_dirname(["seed=0,1,2"])


def test_config_hash_ignores_checkpoint_paths_and_loggers():
    base = config_fingerprint(compose_config(["seed=0"]))
    assert config_fingerprint(compose_config(["seed=0", "checkpoint.dirpath=/tmp/ck", "logger=default",
                                              "logger.wandb.enabled=false", "torch_num_threads=2"])) == base


@pytest.mark.slow  # two launches end to end (~27 s); the fingerprint rule itself: test_multirun.py
def test_relaunch_with_other_thread_count_skips_finished_jobs(tmp_path):
    proc, sweep = multirun(tmp_path, *TINY, "seed=0,1", "prior.prior_precision=1", "torch_num_threads=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(sweep)["counts"]["finished"] == 2
    # Another thread count and the wandb switch: the same sweep, nothing re-run or duplicated.
    proc, again = multirun(tmp_path, *TINY, "seed=0,1", "prior.prior_precision=1", "torch_num_threads=2",
                           "logger.wandb.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert again == sweep
    s = summary(sweep)
    assert s["counts"] == {"finished": 0, "skipped": 2, "failed": 0, "unfinished": 0}, s
    jobs = sorted(p.parent.name for p in sweep.rglob("metrics.json"))
    assert jobs == ["data=toy2d,evaluation=none,prior.prior_precision=1,seed=0,trainer=debug",
                    "data=toy2d,evaluation=none,prior.prior_precision=1,seed=1,trainer=debug"]
    assert all(read_status(sweep / j)["attempts"] == 1 for j in jobs)
    # Every run logs its output folder at its start and end; the sweep logs its folder.
    log = proc.stdout + proc.stderr
    for job in jobs:
        assert f"Output folder: {sweep / job}" in log and f"outputs are in {sweep / job}" in log
    assert f"Sweep folder: {sweep}" in log
    # Another command is another sweep: its own folder, not a shared outputs/default/multirun.
    proc, other = multirun(tmp_path, *TINY, "seed=5")
    assert proc.returncode == 0 and other != sweep and other.parent == sweep.parent
    assert summary(other)["counts"]["finished"] == 1 and not (sweep.parent / "multirun").exists()


def test_launch_into_a_locked_sweep_refuses_naming_the_holder(tmp_path):
    cmd, sweep = multirun_command(tmp_path, *SWEEP)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "launch_id": "holder123", "command": "test"}
    fd = lock.acquire(sweep, holder)
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True,
                              timeout=240)
    finally:
        lock.release(fd)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert f"sweep folder {sweep} is in use by another launch: pid {os.getpid()} on host {socket.gethostname()}" in log
    assert "holder123" in log
    assert not list(sweep.rglob("status.json")) and not read_launches(sweep)  # refused before any job
    with pytest.raises(lock.SweepLocked, match="in use by another launch"):  # the lock is per folder, per process
        fd = lock.acquire(sweep, holder)
        try:
            lock.acquire(sweep, holder)
        finally:
            lock.release(fd)


def _wait_for(path: Path, text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text()[-3000:] if path.is_file() else ''}")


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
def test_two_concurrent_launches_run_every_job_once(tmp_path):
    """Both launches start while the folder is held, wait (lock_wait_s), then run one after the
    other: the first runs the three jobs, the second skips them; each reports its own launch."""
    cmd, sweep = multirun_command(tmp_path, *SWEEP, "hydra.callbacks.sweep_summary.lock_wait_s=300")
    fd = lock.acquire(sweep, {"pid": os.getpid(), "host": socket.gethostname(), "launch_id": "test"})
    procs, logs = [], []
    try:
        for i in range(2):
            logs.append(tmp_path / f"launch{i}.log")
            with open(logs[-1], "w") as out:
                procs.append(subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **ENV}, stdout=out,
                                              stderr=subprocess.STDOUT, text=True))
        for path in logs:  # both are blocked on the lock now
            _wait_for(path, "Waiting up to 300 s for sweep folder")
    finally:
        lock.release(fd)
    codes = [p.wait(timeout=300) for p in procs]
    texts = [p.read_text() for p in logs]
    assert codes == [0, 0], texts
    lines = [next(line for line in t.splitlines() if "Multirun summary" in line) for t in texts]
    assert sorted("3 finished, 0 skipped" in line for line in lines) == [False, True], lines
    assert sorted("0 finished, 3 skipped" in line for line in lines) == [False, True], lines
    jobs = [p.parent for p in sweep.rglob("status.json")]
    assert len(jobs) == 3
    launches = [launch["launch_id"] for launch in read_launches(sweep)]
    assert len(launches) == 2
    for job in jobs:
        status = read_status(job)
        assert status["state"] == "finished" and status["attempts"] == 1, status
        # the marker keeps the launch that ran the job, and names the one that skipped it last
        assert status["launch_id"] == launches[0] and status["last_launch_id"] == launches[1], status
        assert status["last_action"] == "skipped"
        assert not (job / "FAILED").exists()
    assert json.loads((sweep / "summary.json").read_text())["launch_id"] == launches[1]


@pytest.mark.parametrize("hex_id", ["7966e6773611", "123456789012", "1e10abcdef01"])
def test_launch_id_reaches_the_jobs_as_text_even_when_it_reads_as_a_number(tmp_path, monkeypatch, hex_id):
    # Each job reads its launch id from the override the callback adds; Hydra parses that override,
    # so an unquoted 7966e6773611 became inf and 123456789012 an int in the jobs' markers.
    monkeypatch.setattr("laplace_lab.sweeps.status.uuid.uuid4", lambda: SimpleNamespace(hex=hex_id + "0" * 20))
    callback = SweepSummary()
    config = OmegaConf.create({"aggregate": None, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(config)
    try:
        assert callback.launch["launch_id"] == hex_id
        override = [o for o in config.hydra.overrides.hydra if "LAPLACE_LAB_LAUNCH_ID" in o]
        assert len(override) == 1
        assert OverridesParser.create().parse_override(override[0]).value() == hex_id
    finally:
        lock.release(callback.lock_fd)
