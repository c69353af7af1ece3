"""``sweeps.progress`` with ``progress.json``: the epoch and ETA of running jobs (checkpoints or
not), single runs named correctly, and the sweep's jobs done / total and ETA (``SweepETA``)."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from laplace_lab.io.eta import ProgressFile
from laplace_lab.sweeps import progress
from laplace_lab.sweeps.job_progress import progress_text
from laplace_lab.sweeps.sweep_eta import SweepETA, count_jobs

DEAD_PID = 2**22 + 12345  # no such process


def _progress(folder, pid=None, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    ProgressFile(folder).update(**fields)
    record = json.loads((folder / "progress.json").read_text())
    if pid is not None:
        record["pid"] = pid
        (folder / "progress.json").write_text(json.dumps(record))
    return record


def _status(job, **status):
    job.mkdir(parents=True, exist_ok=True)
    (job / "status.json").write_text(json.dumps({"host": socket.gethostname(), **status}))


def test_running_job_shows_epoch_and_eta_without_checkpoints(tmp_path, capsys):
    job = tmp_path / "multirun" / "seed=0"
    _status(job, state="running", pid=os.getpid())
    _progress(job, phase="MAP training", epoch=12, max_epochs=100, epoch_s=58.0, eta_s=88 * 58.0)
    assert progress.main([str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("running   multirun/seed=0  (MAP training: epoch 12/100, 58 s per epoch, about 1 h 25 min left (~")


def test_a_grid_points_newest_progress_wins_and_cut_off_jobs_show_their_last(tmp_path):
    job = tmp_path / "job"
    _status(job, state="running", pid=DEAD_PID)
    _progress(job, phase="MAP training")
    time.sleep(0.01)
    _progress(job / "grid_0.1", phase="MAP training", epoch=3, max_epochs=10, epoch_s=2.0, eta_s=14.0)
    assert progress_text(job, "running", now=time.time()).startswith(
        "MAP training (grid_0.1): epoch 3/10, 2.0 s per epoch, about 14 s left (~")
    assert progress_text(job, "cut off").startswith("last progress at ")
    assert progress_text(job, "cut off").endswith(": MAP training (grid_0.1): epoch 3/10, 2.0 s per epoch")


def test_single_runs_are_named_from_their_files(tmp_path, capsys):
    done = tmp_path / "default" / "2026-01-01_10-00-00"
    _status(done, devices={})  # what a single run's status.json holds: no state
    (done / "metrics.json").write_text("{}")
    _progress(done, phase="finished")
    training = tmp_path / "default" / "2026-01-01_11-00-00"  # no status.json before its training ends
    _progress(training, pid=os.getpid(), phase="MAP training", epoch=2, max_epochs=20, epoch_s=1.5, eta_s=27.0)
    gone = tmp_path / "default" / "2026-01-01_12-00-00"
    _status(gone, devices={})
    _progress(gone, pid=DEAD_PID, phase="Evaluation")
    assert progress.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "finished  default/2026-01-01_10-00-00"
    assert lines[1].startswith("running   default/2026-01-01_11-00-00  (MAP training: epoch 2/20, 1.5 s per epoch, about ")
    assert lines[2].startswith("cut off   default/2026-01-01_12-00-00  (last progress at ")
    assert lines[3] == "1 cut off, 1 finished, 1 running"


@pytest.mark.parametrize("composed, swept, expected", [
    ([], ["seed=0,1,2", "prior.prior_precision=0.1,1"], 6),
    (["experiment=toy2d"], [], 6),                   # the preset's own sweeper params: 2 kinds x 3 seeds
    (["experiment=toy2d"], ["seed=5"], 2),           # the command line wins over the preset's seeds
    (["hydra/sweeper=map_optuna", "hydra.sweeper.n_trials=7"], [], 7),
])
def test_count_jobs(composed, swept, expected):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from tests.conftest import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=composed, return_hydra_config=True)
    with open_dict(cfg):  # what Hydra records for a multirun: the command's overrides, sweeps included
        cfg.hydra.overrides.task = [o for o in composed if not o.startswith("hydra")] + swept
    assert count_jobs(cfg) == expected


def test_sweep_eta_line():
    eta = SweepETA()
    eta.total, eta.started, eta.done, eta.skipped, eta.ran_s = 15, 0.0, 3, 1, [120.0, 140.0]
    line = eta.line(now_unix=0.0)
    assert line.startswith("Sweep: 3/15 jobs done (1 skipped as finished before, 0 failed); 2 min 10 s per job run; "
                           "about 26 min 00 s left (ends ~")
    eta.done = 15
    assert eta.line() == "Sweep: 15/15 jobs done (1 skipped as finished before, 0 failed)"


def test_sweep_eta_counts_ran_skipped_and_failed_jobs(tmp_path, caplog):
    import logging

    from omegaconf import OmegaConf

    eta = SweepETA()
    eta.on_multirun_start(OmegaConf.create({"hydra": {"sweeper": {"n_trials": 4}}}))
    for name, status in (("a", {"state": "finished", "last_action": "skipped"}), ("b", {"state": "finished"}),
                         ("c", {"state": "failed"})):
        _status(tmp_path / name, **status)
        job = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / name)}}})
        eta.on_job_start(job)
        with caplog.at_level(logging.INFO, logger="laplace_lab.sweeps.sweep_eta"):
            eta.on_job_end(job)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "Sweep: 1/4 jobs done (1 skipped as finished before, 0 failed)"  # nothing ran yet: no ETA
    assert lines[1].startswith("Sweep: 2/4 jobs done (1 skipped as finished before, 0 failed); ")
    assert " per job run; about " in lines[1]
    assert lines[2].startswith("Sweep: 3/4 jobs done (1 skipped as finished before, 1 failed); ")
