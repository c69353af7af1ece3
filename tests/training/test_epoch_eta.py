"""Time you can plan with: ``EpochETA`` (remaining training time per epoch), ``progress.json``,
the phase lines of a run, and the evaluation's estimate (``evaluation.timing``)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from laplace_lab.evaluation.timing import EvalTimer
from laplace_lab.io.eta import PROGRESS_FILE, PhaseLog, ProgressFile, format_duration, read_progress
from laplace_lab.train import run
from laplace_lab.training.epoch_eta import EpochETA
from tests.conftest import compose_config


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (0.042, "0.04 s"), (4.25, "4.2 s"), (42, "42 s"),
                                           (185, "3 min 05 s"), (7620, "2 h 07 min"), (-3, "0 s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_epoch_eta_logs_after_the_first_epoch_then_at_most_every_interval(tmp_path, caplog):
    clock = FakeClock()
    eta = EpochETA(tmp_path, log_every_s=60, clock=clock)
    trainer = SimpleNamespace(current_epoch=0, max_epochs=10)
    with caplog.at_level(logging.INFO, logger="laplace_lab.training.epoch_eta"):
        eta.on_fit_start(trainer, None)
        for epoch in range(10):
            trainer.current_epoch = epoch
            eta.on_train_epoch_start(trainer, None)
            clock.t += 30.0  # 30 s per epoch
            eta.on_train_epoch_end(trainer, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("MAP training: epoch 1/10, 30 s per epoch; about 4 min 30 s left (ends ~")
    assert lines[1].startswith("MAP training: epoch 3/10, 30 s per epoch; about 3 min 30 s left")  # 60 s later
    assert lines[-1] == "MAP training: epoch 10/10, 30 s per epoch; done"
    assert len(lines) == 6  # epochs 1, 3, 5, 7, 9 and the last
    record = read_progress(tmp_path)
    assert record["phase"] == "MAP training" and record["epoch"] == 10 and record["max_epochs"] == 10
    assert record["epoch_s"] == pytest.approx(30.0) and record["eta_s"] == 0


def test_a_resumed_training_counts_only_its_own_epochs(tmp_path):
    clock = FakeClock()
    eta = EpochETA(tmp_path, clock=clock)
    trainer = SimpleNamespace(current_epoch=40, max_epochs=50)  # resumed at epoch 40
    eta.on_train_epoch_start(trainer, None)
    clock.t += 12.0
    eta.on_train_epoch_end(trainer, None)
    assert read_progress(tmp_path)["eta_s"] == pytest.approx(12.0 * 9)


def test_progress_file_merges_writers_and_resets_per_phase(tmp_path):
    ProgressFile(tmp_path).update(phase="MAP training", epoch=3, max_epochs=5, epoch_s=2.0, eta_s=4.0)
    record = ProgressFile(tmp_path).update(phase="Laplace fit")  # another writer, the next phase
    assert record["phase"] == "Laplace fit" and record["epoch"] == 3 and "eta_s" not in record
    assert json.loads((tmp_path / PROGRESS_FILE).read_text()) == record


def test_phase_lines(tmp_path, caplog):
    clock = FakeClock()
    phases = PhaseLog(tmp_path, clock=clock)
    with caplog.at_level(logging.INFO, logger="laplace_lab.io.eta"):
        clock.t += 64
        phases.start("Laplace fit", "last_layer kron ggn")
        phases.eta(30.0)
        assert read_progress(tmp_path)["eta_s"] == 30.0
        phases.finish()
    assert caplog.records[0].getMessage() == "Laplace fit starts, 1 min 04 s into the run: last_layer kron ggn"
    assert read_progress(tmp_path)["phase"] == "finished"


def test_eval_timer_estimates_the_rest_from_the_test_pass(caplog):
    clock, etas = FakeClock(), []
    timer = EvalTimer({"ood": 30000, "rotation": 130000, "cifar10c": 0}, ["adversarial"], on_eta=etas.append,
                      clock=clock)
    with caplog.at_level(logging.INFO, logger="laplace_lab.evaluation.timing"):
        timer.test_done(10.0, 10000)  # 1 ms per input
        with timer.section("ood"):
            clock.t += 31.0
        with timer.section("rotation"):
            clock.t += 120.0
        with timer.section("adversarial"):
            clock.t += 5.0
        with timer.section("toy2d"):  # not planned, not run: no line
            pass
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("evaluation: test set in 10 s (10000 inputs); about 2 min 40 s for the rest (ood: 30000 "
                        "inputs, rotation: 130000 inputs; not estimated: adversarial)")
    assert lines[1] == "evaluation: ood in 31 s; about 2 min 10 s left"
    assert lines[2:] == ["evaluation: rotation in 2 min 00 s", "evaluation: adversarial in 5.0 s"]
    assert etas == pytest.approx([160.0, 130.0, 0.0, 0.0, 0.0])


def test_a_run_logs_its_phases_and_writes_progress(tmp_path, caplog):
    cfg = compose_config(["data.n_train=64", "data.n_val=32", "data.n_test=32", "trainer.max_epochs=3",
                          "trainer.enable_progress_bar=false", "evaluation.progress=false",
                          "evaluation.toy2d.resolution=10"])
    with caplog.at_level(logging.INFO):
        run(cfg, tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    starts = [line.split(" starts,")[0] for line in lines if " starts, " in line]
    assert starts == ["MAP training", "Laplace fit", "Evaluation"]
    assert any(line.startswith("MAP training: epoch 1/3, ") and "left" in line for line in lines)
    assert any(line.startswith("evaluation: test set in ") for line in lines)
    record = read_progress(tmp_path)
    assert record["phase"] == "finished" and record["epoch"] == 3 and record["max_epochs"] == 3
