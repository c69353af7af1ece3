"""Training guards: a non-finite loss stops the run (or skips the batch), non-finite final metrics
fail the run, and online marglik's rejected hyper steps are counted and warned about."""

from __future__ import annotations

import json
import logging
import math

import pytest

import laplace_lab.laplace.hyper as hyper
from laplace_lab.sweeps.status import read_status
from laplace_lab.train import NonFiniteMetricsError, run
from tests.conftest import compose_config
from tests.sweeps.helpers import multirun, summary

# SGD with a learning rate of 1e8 on 64 sinusoid points: the weights overflow within 3 epochs.
DIVERGING = ["data=sinusoid", "data.n_train=64", "data.n_val=32", "data.n_test=32", "optimizer=sgd",
             "optimizer.lr=1e8", "logger=csv", "evaluation=none", "marglik=off", "predictive=map",
             "trainer.enable_progress_bar=false"]


def test_nonfinite_loss_stops_the_run(tmp_path):
    cfg = compose_config([*DIVERGING, "trainer.max_epochs=3"])
    with pytest.raises(FloatingPointError, match=r"non-finite training loss .* at epoch \d+, batch \d+.*on_nonfinite_loss=skip"):
        run(cfg, tmp_path)
    assert not (tmp_path / "metrics.json").exists()


def test_nonfinite_loss_skip_counts_batches_and_final_nan_fails(tmp_path):
    cfg = compose_config([*DIVERGING, "trainer.max_epochs=3", "on_nonfinite_loss=skip"])
    with pytest.raises(NonFiniteMetricsError, match=r"final metrics are not finite: \{'val/nll'"):
        run(cfg, tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())  # kept for inspection
    assert saved["train/skipped_batches"] >= 1 and not math.isfinite(saved["val/nll"])


def test_nonfinite_final_metrics_mark_the_job_failed(tmp_path):
    """A multirun job that trains to an infinite val/nll is failed (status.json, FAILED) and the
    sweep exits 1 (a single run raises, as ``test_nonfinite_loss_skip_...`` shows)."""
    args = [*DIVERGING, "trainer.max_epochs=2", "seed=0", "optimizer.lr=1e-3,1e8"]
    proc, sweep = multirun(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    s = summary(sweep)
    assert s["counts"]["finished"] == 1 and s["counts"]["failed"] == 1, s
    (failed,) = s["failed"]
    assert "optimizer.lr=100000000," in failed["job"] and "not finite" in failed["error"]
    job = sweep / failed["job"]
    assert read_status(job)["state"] == "failed" and "NonFiniteMetricsError" in (job / "FAILED").read_text()


def test_rejected_hyper_steps_are_counted_and_warned(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(hyper, "all_finite", lambda tensors: False)  # every autograd hyper step rejected
    closed_form = hyper.MarglikOptimizer.closed_form

    class NaNGradient:  # the device-side loop (run_closed_form) sees a non-finite gradient
        def __init__(self, fast):
            self.fast = fast

        def grad_log(self, log_prior, log_sigma):
            g_prior, g_sigma = self.fast.grad_log(log_prior, log_sigma)
            return g_prior * float("nan"), None if g_sigma is None else g_sigma * float("nan")

    monkeypatch.setattr(hyper.MarglikOptimizer, "closed_form",
                        staticmethod(lambda la: None if (f := closed_form(la)) is None else NaNGradient(f)))
    cfg = compose_config(["data=toy2d", "data.n_train=64", "data.n_val=32", "data.n_test=32", "marglik=online",
                          "marglik.n_steps=4", "trainer.max_epochs=2", "curvature=kron", "logger=csv",
                          "evaluation=none", "predictive=map", "trainer.enable_progress_bar=false"])
    with caplog.at_level(logging.WARNING, logger="laplace_lab.training.online_marglik"):
        metrics = run(cfg, tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["marglik/rejected_steps"] == metrics["marglik/rejected_steps"] == 8.0
    assert saved["marglik/accepted_steps"] == 0.0
    loud = [r.getMessage() for r in caplog.records if "REJECTED" in r.getMessage()]
    assert len(loud) == 2 and "4 of 4 hyper steps" in loud[0]
    assert any("8 of 8 hyper steps were rejected" in r.getMessage() for r in caplog.records)


# --- resume checks ----------------------------------------------------------------------------
RESUME = ["data.n_train=64", "data.n_val=32", "data.n_test=32", "logger=csv", "evaluation=none", "marglik=off",
          "predictive=map", "trainer.enable_progress_bar=false", "checkpoint.enabled=true"]


def test_resume_requires_the_same_seed_data_and_model(tmp_path):
    run(compose_config([*RESUME, "trainer.max_epochs=1", "seed=0"]), tmp_path / "first")
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    resume = [*RESUME, "trainer.max_epochs=2", f"checkpoint.resume_from={last}"]
    with pytest.raises(ValueError, match=r"written by a different run.*seed: checkpoint 0, this run 1"):
        run(compose_config([*resume, "seed=1"]), tmp_path / "other_seed")
    with pytest.raises(ValueError, match=r"data.n_train: checkpoint 64, this run 48"):
        run(compose_config([*resume, "data.n_train=48"]), tmp_path / "other_data")
    with pytest.raises(ValueError, match=r"model.widths: checkpoint \[50\], this run \[20\]"):
        run(compose_config([*resume, "model.widths=[20]"]), tmp_path / "other_model")
    metrics = run(compose_config([*resume, "seed=0"]), tmp_path / "same")  # the matching run resumes
    assert math.isfinite(metrics["val/nll"])
