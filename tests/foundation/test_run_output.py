"""What a run prints: config errors without a traceback, one log line per long phase, and the
under-training warning of regression runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from laplace_lab.train import run, warn_if_underfit
from tests.conftest import compose_config

BAD = ["curvature=kron", "prior=diagonal"]  # rejected by config.validation before any work


def _train(args: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | env
    return subprocess.run([sys.executable, "-m", "laplace_lab.train", *args, f"hydra.run.dir={tmp_path}"],
                          capture_output=True, text=True, env=environ, timeout=300)


def test_config_error_prints_the_message_alone(tmp_path):
    proc = _train(BAD, tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("Config error: prior.structure='diagonal'"), proc.stderr
    assert "HYDRA_FULL_ERROR=1" in lines[-1] and len(lines) == 2, proc.stderr


def test_config_error_traceback_with_hydra_full_error(tmp_path):
    proc = _train(BAD, tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "prior.structure='diagonal'" in proc.stderr
    assert "Config error:" not in proc.stderr


def test_long_phases_log_one_line_each(tmp_path, caplog):
    """MAP training, every online-marglik phase, the post-hoc fit and its prior tuning, the evaluation."""
    cfg = compose_config(["data=sinusoid", "trainer.max_epochs=4", "trainer.enable_progress_bar=false",
                          "marglik=online", "marglik.frequency=2", "marglik.n_steps=3", "marglik.burnin=0",
                          "predictive=glm_probit", "logger=csv", "evaluation=regression", "evaluation.progress=false"])
    with caplog.at_level(logging.INFO, logger="laplace_lab"):
        run(cfg, tmp_path)
    text = [r.getMessage() for r in caplog.records]
    marglik = [m for m in text if m.startswith("Online marglik, epoch")]
    assert [m.split(":")[0] for m in marglik] == ["Online marglik, epoch 2", "Online marglik, epoch 4"]
    assert all("3 hyper steps" in m and "log marglik" in m and "sigma" in m for m in marglik)
    assert sum(m.startswith("MAP training: trained, 4 epochs") for m in text) == 1
    assert sum(m.startswith("Evaluation:") for m in text) == 1


def test_posthoc_fit_logs_structure_batches_and_time(tmp_path, caplog):
    cfg = compose_config(["data=sinusoid", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                          "logger=csv", "evaluation=none", "curvature=ll_kron", "marglik=posthoc"])
    with caplog.at_level(logging.INFO, logger="laplace_lab"):
        run(cfg, tmp_path)
    fits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Laplace fit:")]
    assert len(fits) == 1 and "last_layer kron ggn" in fits[0] and "batches" in fits[0], fits


@pytest.mark.parametrize(("rmse", "warns"), [(15.2, True), (15.1, True), (10.8, False)])
def test_underfit_warning(rmse, warns, caplog):
    with caplog.at_level(logging.WARNING, logger="laplace_lab"):
        assert warn_if_underfit({"test/map/rmse": rmse}, target_std=15.1) is warns
    assert any("Under-trained?" in r.getMessage() for r in caplog.records) is warns


def test_underfit_warning_ignores_classification():
    assert warn_if_underfit({"test/map/acc": 0.1}, target_std=1.0) is False


@pytest.mark.slow
def test_ray_jobs_end_without_wandb_traceback(tmp_path):
    """Each Ray worker shuts wandb down before exiting (no ConnectionResetError traceback per job)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="hydra-ray-launcher not installed")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "laplace_lab.train", "-m", "hydra/launcher=ray", "seed=0,1",
                           "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "evaluation=none",
                           f"paths.output_root={tmp_path}"], capture_output=True, text=True, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "2 finished" in output and len(list(tmp_path.glob("default/multirun/*/wandb/offline-run-*"))) == 2
    assert "ConnectionResetError" not in output and "Traceback" not in output, output[-3000:]


def test_a_multirun_job_prints_one_line_for_its_final_metrics(capsys, tmp_path):
    from laplace_lab.train import print_final_metrics

    metrics = {"test/map/acc": 0.5, "test/la/acc": 0.25, "val/nll": 1.0}
    print_final_metrics(metrics, tmp_path / "metrics.json", multirun=False)
    single = capsys.readouterr().out
    assert "test/map/acc: 0.5000" in single and "val/nll" not in single and single.count("\n") == 3
    print_final_metrics(metrics, tmp_path / "metrics.json", multirun=True)
    assert capsys.readouterr().out == f"Final metrics: 3 values in {tmp_path / 'metrics.json'}\n"
