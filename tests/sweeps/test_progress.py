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


@pytest.mark.parametrize("record, shown", [
    ({"phase": "MAP training", "epoch": "x", "updated_unix": "soon", "eta_unix": [1]}, "(MAP training)"),
    ({"phase": "MAP training", "epoch": 3, "max_epochs": None, "epoch_s": "slow", "updated_unix": 1e300},
     "(last progress at ?: MAP training: epoch 3/?)"),
    ({"phase": ["not", "text"], "epoch": float("nan")}, "(?)"),
    ([1, 2, 3], ""),  # not a record at all: no progress shown
    ("text", ""),
])
def test_a_malformed_progress_file_skips_the_bad_field_and_lists_every_job(tmp_path, capsys, record, shown):
    """A malformed ``progress.json`` (wrong types, not an object): its bad fields are left out, the
    job and every other job are still listed, as for unreadable status files."""
    sweep = tmp_path / "multirun"
    bad = _job(sweep, "a_bad", {"state": "running", "pid": 2**22 + 12347}, config=False)
    (bad / "progress.json").write_text(json.dumps(record))
    done = _job(sweep, "b_done", {"state": "finished"})
    (done / "metrics.json").write_text("{}")
    assert progress.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"cut off   multirun/a_bad{'  ' + shown if shown else ''}", "finished  multirun/b_done",
                     "1 cut off, 1 finished"]
