"""The plan of a run's Laplace (``training.laplace_plan``): one log line before training, an
impossible configuration refused before any training, and ``python -m laplace_lab.plan``'s table."""

from __future__ import annotations

import logging

import pytest

from laplace_lab.laplace import plan
from laplace_lab.laplace.plan import MemoryPlanError
from laplace_lab.training import fit as training_fit
from laplace_lab.training.build import build
from laplace_lab.training.laplace_plan import check_run_laplace
from laplace_lab.training.loops import PLAIN, PlainLoop
from tests.conftest import run_config

SINUSOID = ["data=sinusoid", "trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false",
            "evaluation=regression", "evaluation.progress=false", "marglik.n_steps=2"]


def test_run_logs_the_plan_of_its_laplace_in_one_line(caplog):
    run = run_config([*SINUSOID, "curvature.hessian_structure=kron", "curvature.subset_of_weights=all"])
    datamodule, module = build(run, PLAIN)
    with caplog.at_level(logging.INFO, logger="laplace_lab.training.laplace_plan"):
        check_run_laplace(run, datamodule, module.model, module.likelihood)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Laplace plan:")]
    assert "all kron ggn" in line and "fit peak ~" in line and "fit ~" in line and " s" in line
    assert "output factors held (fixed size rule)" in line  # the CPU: FACTOR_BUDGET's rule, far below it


def test_impossible_laplace_refused_before_training(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "available_memory", lambda device: 1)
    monkeypatch.setattr(PlainLoop, "make_trainer", lambda *a, **k: pytest.fail("training started"))
    run = run_config([*SINUSOID, "curvature=full"])
    with pytest.raises(MemoryPlanError, match="hessian_structure='full'"):
        training_fit.train_map(run, tmp_path, [], PLAIN)


def test_plan_command_prints_every_structure(capsys):
    from laplace_lab.plan import main

    main(["data=sinusoid", "--no-time"])
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "structure" not in ln]
    assert {tuple(c.strip() for c in ln.split("|")[1:3]) for ln in rows} == {
        (s, sub) for s in ("diag", "full", "kron", "lowrank") for sub in ("all", "last_layer")}
    assert all(ln.rstrip(" |").endswith(("yes", "NO")) for ln in rows)


def test_gpu_run_is_planned_against_the_gpu_without_a_cpu_time_probe(monkeypatch, caplog):
    import torch

    from laplace_lab.training import laplace_plan

    seen = []
    monkeypatch.setattr(laplace_plan, "resolve_device", lambda accelerator: torch.device("cuda", 0))
    monkeypatch.setattr(plan, "available_memory", lambda device: seen.append(str(device)) or 64 * 2**30)
    monkeypatch.setattr(plan, "probe_fit_time", lambda *a, **k: pytest.fail("timed on the CPU"))
    run = run_config([*SINUSOID, "curvature.hessian_structure=kron", "curvature.subset_of_weights=all"])
    datamodule, module = build(run, PLAIN)
    with caplog.at_level(logging.INFO, logger="laplace_lab.training.laplace_plan"):
        check_run_laplace(run, datamodule, module.model, module.likelihood)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Laplace plan:")]
    assert "available on cuda:0" in line and "not probed (the network is on cpu" in line
    assert set(seen) == {"cuda:0"}


def test_auto_fit_batch_and_streaming_named_in_the_plan_line(monkeypatch, caplog):
    """``fit_batch_size=auto`` for a CUDA run: the chosen batch (the largest 16 x 2^k within the 150
    training points, all memory free) and the budget's streaming decision appear in the one line;
    on the CPU auto is ``data.eval_batch_size``."""
    import torch

    from laplace_lab.training import laplace_plan

    overrides = [*SINUSOID, "curvature.hessian_structure=kron", "curvature.subset_of_weights=all",
                 "curvature.fit_batch_size=auto", "+data.eval_batch_size=16"]
    run = run_config(overrides)
    datamodule, module = build(run, PLAIN)
    with caplog.at_level(logging.INFO, logger="laplace_lab.training.laplace_plan"):
        check_run_laplace(run, datamodule, module.model, module.likelihood)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Laplace plan:")]
    assert "10 batches of 16 (fit_batch_size=auto)" in line
    caplog.clear()
    monkeypatch.setattr(laplace_plan, "resolve_device", lambda accelerator: torch.device("cuda", 0))
    monkeypatch.setattr(plan, "available_memory", lambda device: 64 * 2**30)
    with caplog.at_level(logging.INFO, logger="laplace_lab.training.laplace_plan"):
        check_run_laplace(run, datamodule, module.model, module.likelihood)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Laplace plan:")]
    assert len(datamodule.train_set) < 256
    assert "2 batches of 128 (fit_batch_size=auto)" in line
    assert "output factors held (memory budget rule)" in line
