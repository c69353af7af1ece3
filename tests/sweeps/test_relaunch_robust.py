"""One broken file never blocks a sweep: a cut-off ``metrics.json`` / ``status.json`` is named, moved
aside and the job runs again (an earlier attempt's wandb run moved out of ``wandb/``); a cut-off ``launches.jsonl`` line is named and skipped, and the next
launch starts on a line of its own; an unreadable MAP-cache entry is named and retrained; writers
never share a temporary file (``io.atomic``)."""

from __future__ import annotations

import json
import logging

import pytest

from laplace_lab.io import atomic
from laplace_lab.reporting import tables
from laplace_lab.reporting.table_spec import TableSpec
from laplace_lab.sweeps import progress
from laplace_lab.sweeps.status import read_launches, record_launch
from laplace_lab.train import run
from laplace_lab.training import map_cache
from tests.conftest import compose_config
from tests.reporting.test_tables import make_job

from .helpers import TINY, multirun, summary


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
def test_cut_off_job_files_are_moved_aside_and_the_jobs_run_again(tmp_path, capsys):
    proc, sweep = multirun(tmp_path, *TINY, "seed=0,1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    done, other = (next(sweep.glob(f"*seed={seed}*")) for seed in (0, 1))
    text = (done / "metrics.json").read_text()
    (done / "metrics.json").write_text(text[: len(text) // 2])  # a finished job's metrics cut off
    status = (other / "status.json").read_text()
    (other / "status.json").write_text(status[:40])
    assert progress.main([str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"unreadable {done.name}  (state finished, but metrics.json is not valid JSON"), lines
    assert lines[1].startswith(f"unreadable {other.name}  (status.json is not valid JSON"), lines
    old_run = other / "wandb" / "offline-run-20250101_000000-killed"  # the killed attempt's wandb run
    old_run.mkdir(parents=True)
    proc, again = multirun(tmp_path, *TINY, "seed=0,1")
    assert again == sweep and proc.returncode == 0, proc.stderr[-3000:]
    assert not old_run.exists() and len(list(other.glob("superseded/*/wandb/offline-run-*-killed"))) == 1
    assert summary(sweep)["counts"] == {"finished": 2, "skipped": 0, "failed": 0, "unfinished": 0}
    for job, name in ((done, "metrics.json"), (other, "status.json")):
        assert len(list(job.glob(f"{name}.unreadable-*"))) == 1
        output = proc.stdout + proc.stderr  # (Hydra's log goes to stdout)
        assert f"{job / name}: {name} is not valid JSON" in output and "moved aside" in output
    assert json.loads((done / "metrics.json").read_text())  # rewritten by the rerun


def test_a_cut_off_launch_line_is_named_skipped_and_not_appended_onto(tmp_path, caplog):
    sweep = tmp_path / "multirun"
    job = make_job(sweep, "mlp", "kron", 0, {"test/map/acc": 0.9})
    (sweep / "launches.jsonl").write_text(json.dumps({"launch_id": "L1", "command": "python -m laplace_lab.train -m x=1"})
                                          + '\n{"launch_id": "L2", "comm')
    with caplog.at_level(logging.WARNING):
        assert [launch["launch_id"] for launch in read_launches(sweep)] == ["L1"]
    assert f"{sweep / 'launches.jsonl'}: line 2 left out: not valid JSON" in caplog.text
    paths = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]))  # the table is written, its job's launch known
    assert "x=1" in paths[0].read_text() and job.name in paths[2].read_text()
    record_launch(sweep, {"launch_id": "L3", "command": "c"})
    assert [launch["launch_id"] for launch in read_launches(sweep)] == ["L1", "L3"]
    assert (sweep / "launches.jsonl").read_text().splitlines()[2] == '{"launch_id": "L3", "command": "c"}'


@pytest.mark.parametrize("garbage", [b"garbage!" * 10, b"", b"PK\x03\x04broken zip", b"list"])
def test_unreadable_cache_entries_are_named(tmp_path, caplog, garbage):
    import torch

    path = tmp_path / "k.pt"
    if garbage == b"list":  # loads, but is not a state dict
        torch.save([1, 2], path)
    else:
        path.write_bytes(garbage)
    with caplog.at_level(logging.WARNING):
        assert map_cache.load(torch.nn.Linear(2, 2), path) is False
    assert f"MAP cache entry {path} is unreadable" in caplog.text


def test_an_unreadable_cache_entry_is_retrained(tmp_path, caplog):
    garbage = b"garbage!" * 10
    base = ["trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false", "map_cache.enabled=true",
            f"map_cache.dir={tmp_path / 'cache'}", "evaluation=none", "marglik=off", "predictive=map",
            "data.n_train=64", "data.n_val=16", "torch_num_threads=1"]
    first = run(compose_config(base), tmp_path / "a")
    (entry,) = (tmp_path / "cache").glob("*.pt")
    entry.write_bytes(garbage)
    with caplog.at_level(logging.WARNING):
        second = run(compose_config(base), tmp_path / "b")
    assert "map_cache/hit" not in second and second["val/nll"] == first["val/nll"]
    assert f"MAP cache entry {entry} is unreadable" in caplog.text
    third = run(compose_config(base), tmp_path / "c")  # the entry was written again
    assert third["map_cache/hit"] == 1.0


def test_writers_use_unique_temporary_names(tmp_path, monkeypatch):
    import torch

    seen = []
    real_save = torch.save
    monkeypatch.setattr(map_cache.torch, "save", lambda obj, f: (seen.append(str(f)), real_save(obj, f)))
    module = torch.nn.Linear(2, 2)
    path = tmp_path / "k.pt"
    assert map_cache.save(module, path) and map_cache.save(module, path)
    assert len(set(seen)) == 2 and str(path.with_suffix(".tmp")) not in seen
    assert [p.name for p in tmp_path.iterdir()] == ["k.pt"]  # no temporary file left
    assert atomic.temp_name(path) != atomic.temp_name(path)
    with pytest.raises(RuntimeError), atomic.atomic_path(tmp_path / "x.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pt"]  # a failed write leaves nothing
