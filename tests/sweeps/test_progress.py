"""``python -m laplace_lab.sweeps.progress``: each job's state and the epochs its checkpoints saved."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from laplace_lab.sweeps import progress


def _job(sweep, name, status, epochs=None, config=True):
    job = sweep / name
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"host": socket.gethostname(), **status}))
    if config:
        (job / "config_resolved.yaml").write_text("trainer:\n  max_epochs: 250\n")
    for sub, epoch in (epochs or {}).items():
        (job / sub / "checkpoints").mkdir(parents=True)
        torch.save({"epoch": epoch, "global_step": 0}, job / sub / "checkpoints" / "last.ckpt")
    return job


def test_states_and_saved_epochs(tmp_path, capsys):
    sweep = tmp_path / "multirun"
    done = _job(sweep, "a_done", {"state": "finished", "wall_s": 12.3})
    (done / "metrics.json").write_text("{}")
    resumed = _job(sweep, "a_resumed", {"state": "finished", "wall_s": 100.4})  # 2nd launch after a cut
    (resumed / "metrics.json").write_text('{"checkpoint/resumed_fit_s": 900.0}')
    _job(sweep, "b_failed", {"state": "failed", "pid": 1})
    _job(sweep, "c_cut", {"state": "running", "pid": 2**22 + 12345}, {".": 142})  # no such process
    _job(sweep, "d_grid", {"state": "running", "pid": 2**22 + 12346}, {"grid_0.01": 249, "grid_0.1": 9})
    _job(sweep, "e_alive", {"state": "running", "pid": __import__("os").getpid()}, config=False)
    assert progress.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "finished  multirun/a_done  (12 s)"
    assert lines[1] == "finished  multirun/a_resumed  (1000 s)"  # the earlier launch's training counts
    assert lines[2] == "failed    multirun/b_failed"
    assert lines[3] == "cut off   multirun/c_cut  (epochs saved: 143/250)"
    assert lines[4] == "cut off   multirun/d_grid  (epochs saved: grid_0.01 250/250, grid_0.1 10/250)"
    assert lines[5] == "running   multirun/e_alive"
    assert lines[6] == "2 cut off, 1 failed, 2 finished, 1 running"


def test_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(SystemExit):
        progress.main([str(tmp_path / "nope")])
