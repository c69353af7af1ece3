"""Runs log to an offline W&B run by default (the plain loop too); the end of a run names it and the
one command that uploads it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from laplace_lab.io.wandb_offline import offline_runs, sync_hint
from laplace_lab.reporting.run_loggers import build_loggers
from laplace_lab.sweeps import jobs
from laplace_lab.train import run
from tests.conftest import compose_config, load_script, run_config


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


@pytest.mark.parametrize("overrides", [[], ["data=sinusoid"]], ids=["default", "sinusoid"])
def test_runs_log_to_wandb_unless_told_not_to(overrides):
    """The default run and the data recipes keep W&B on; the switch and WANDB_MODE=disabled turn it off."""
    assert compose_config(overrides).logger.wandb.enabled is True
    assert compose_config([*overrides, "logger.wandb.enabled=false"]).logger.wandb.enabled is False
    no_csv = [*overrides, "logger.csv=false"]
    assert build_loggers(run_config(no_csv), Path("unused"), plain=True) == []  # the suite's WANDB_MODE=disabled
    with pytest.raises(ValueError, match=r"logger.wandb.mode='dryrun' is not supported; allowed: \['offline'"):
        build_loggers(run_config([*no_csv, "logger.wandb.mode=dryrun"]), Path("unused"), plain=True)


@pytest.mark.slow  # wandb's start-up and a toy run: ~10 s on an idle core
def test_plain_loop_run_writes_the_offline_wandb_run(tmp_path, caplog):
    """A toy run keeps the plain loop with W&B on; its offline run has the training curve, the final
    metrics and the evaluation's figures and tables."""
    read_wandb_keys = load_script(Path(__file__).parents[1] / "evaluation" / "eval_helpers.py").read_wandb_keys
    cfg = compose_config(["trainer.max_epochs=2", "logger.wandb.mode=offline", "evaluation.ood.enabled=false",
                          "evaluation.toy2d.resolution=15", "evaluation.progress=false"])
    with caplog.at_level(logging.INFO):
        run(cfg, tmp_path)
    assert any(r.getMessage().startswith("Training loop: plain") for r in caplog.records)
    (run_dir,) = offline_runs(tmp_path)
    keys = read_wandb_keys(run_dir)
    assert {"train/loss", "trainer/global_step", "test/la/nll", "laplace/log_marglik", "figures/toy2d_zoom_out",
            "figures/reliability", "tables/reliability", "charts/reliability_table"} <= keys, sorted(keys)
