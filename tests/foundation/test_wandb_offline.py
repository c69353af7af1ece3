"""The end of a run names its offline W&B run and the one command that uploads it."""

from __future__ import annotations

import logging

from laplace_lab.io.wandb_offline import offline_runs, sync_hint
from laplace_lab.sweeps import jobs


def test_sync_hint_names_the_folder_and_the_command(tmp_path):
    assert sync_hint(tmp_path) is None and offline_runs(tmp_path) == []
    first = tmp_path / "wandb" / "offline-run-20261128_161200-abc123"
    first.mkdir(parents=True)
    (tmp_path / "wandb" / "latest-run").mkdir()  # wandb's own link folder: not a run
    assert sync_hint(tmp_path) == f"W&B offline run: {first}; upload it with: wandb sync {first}"
    second = tmp_path / "wandb" / "offline-run-20261128_171200-def456"  # a resumed run's second launch
    second.mkdir()
    assert offline_runs(tmp_path) == [first, second]
    assert sync_hint(tmp_path) == (f"W&B offline runs: 2 in {tmp_path / 'wandb'}; upload them with: "
                                   f"wandb sync {tmp_path / 'wandb'}/offline-run-*")


def test_the_run_ends_with_the_sync_command(tmp_path, monkeypatch, caplog):
    def fake_run(run_fn, cfg, output_dir):
        (output_dir / "wandb" / "offline-run-20261128_161200-abc123").mkdir(parents=True)
        return 0.5

    monkeypatch.setattr(jobs, "_run_tracked", fake_run)
    with caplog.at_level(logging.INFO):
        assert jobs.run_tracked(None, {}, tmp_path) == 0.5
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-2] == f"Run ended; its outputs are in {tmp_path.resolve()}"
    assert lines[-1].startswith("W&B offline run: ") and lines[-1].endswith(
        f"wandb sync {tmp_path.resolve() / 'wandb' / 'offline-run-20261128_161200-abc123'}")
