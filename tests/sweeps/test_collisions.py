"""Paths that cannot collide: the jobs of a multirun with an explicit ``checkpoint.dirpath`` get a
folder each under it; a second single run into a busy ``hydra.run.dir`` is refused before Hydra
writes there; an Optuna, a grid and a basic sweep over the same overrides get three folders, and
``tables`` tells their launches apart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from laplace_lab.reporting import provenance
from laplace_lab.sweeps import lock
from laplace_lab.sweeps.callback import name_sweep_dir
from laplace_lab.sweeps.jobs import job_checkpoint_dir
from laplace_lab.sweeps.run_only import sweep_dirname, sweeper_choice

from .helpers import ENV, multirun, summary

SMALL = ["data=toy2d", "data.n_train=32", "data.n_val=16", "data.n_test=16", "trainer.max_epochs=1", "logger=csv",
         "evaluation=none", "marglik=off", "predictive=map", "trainer.loop=lightning", "torch_num_threads=1"]


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
def test_jobs_sharing_an_explicit_checkpoint_dirpath_get_a_folder_each(tmp_path):
    ck = tmp_path / "ck"
    overrides = (*SMALL, "seed=0,1", "checkpoint.enabled=true", "checkpoint.resume_from=last", f"checkpoint.dirpath={ck}")
    proc, sweep = multirun(tmp_path, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]  # job 2 resumed job 1's checkpoint and failed before
    saved = sorted(p.relative_to(ck) for p in ck.rglob("last.ckpt"))
    assert len(saved) == 2 and saved[0].parent != saved[1].parent, saved
    assert all(p.parts[:2] == ("default", sweep.name) for p in saved), saved
    assert summary(sweep)["counts"]["finished"] == 2


def test_job_checkpoint_dir_is_under_the_dirpath_by_the_jobs_folder(tmp_path):
    job = tmp_path / "out" / "exp" / "multirun_seed=0,1" / "seed=0"
    assert job_checkpoint_dir("/ck", job, str(tmp_path / "out")) == "/ck/exp/multirun_seed=0,1/seed=0"
    assert job_checkpoint_dir("/ck", job, "/elsewhere") == "/ck/exp/multirun_seed=0,1/seed=0"


def test_a_second_run_into_a_busy_run_folder_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    fd = lock.acquire(run_dir, {"pid": os.getpid(), "host": socket.gethostname(), "launch_id": "first"},
                      what="run folder", advice=lock.RUN_ADVICE)
    try:
        proc = subprocess.run([sys.executable, "-m", "laplace_lab.train", *SMALL, f"hydra.run.dir={run_dir}"],
                              cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=300)
    finally:
        lock.release(fd)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert f"run folder {run_dir} is in use by another launch: pid {os.getpid()}" in log and "hydra.run.dir=" in log
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written by the second run


def test_sweepers_name_their_folders():
    assert sweeper_choice(["hydra/sweeper=map_optuna", "hydra.sweeper.n_trials=3"]) == "map_optuna"
    assert sweeper_choice(["hydra.sweep.dir=x"]) is None
    names = {sweep_dirname(["data=toy2d"], s) for s in (None, "basic", "map_grid", "map_optuna")}
    assert names == {"multirun_data=toy2d", "multirun_map_grid_data=toy2d", "multirun_map_optuna_data=toy2d"}
    assert sweep_dirname([], "map_grid") == "multirun_map_grid" and sweep_dirname(["experiment=x"]) == "multirun"
    config = OmegaConf.create({"hydra": {"sweep": {"dir": "/o/default/multirun"},
                                         "overrides": {"hydra": ["hydra/sweeper=map_grid"], "task": ["data=toy2d"]}}})
    assert str(name_sweep_dir(config)) == "/o/default/multirun_map_grid_data=toy2d"


def test_tables_tell_launches_of_different_sweepers_apart():
    runs = [SimpleNamespace(path=name) for name in ("a", "b")]
    launches = {"a": {"command": "python -m laplace_lab.train -m hydra/sweeper=map_optuna data=toy2d"},
                "b": {"command": "python -m laplace_lab.train -m hydra/sweeper=map_grid data=toy2d"}}
    problems = provenance.launch_problems(runs, launches)
    assert problems and "hydra/sweeper=map_optuna" in problems[0] and "hydra/sweeper=map_grid" in problems[0]
    launches["b"]["command"] = "python -m laplace_lab.train -m hydra/launcher=ray data=toy2d hydra/sweeper=map_optuna"
    assert provenance.launch_problems(runs, launches) == []  # the launcher stays run-only
