"""A finished online-marglik job's final Laplace rebuilt from its folder (training/job_laplace.py),
and experiments/immer2021_uci/marglik_terms.py on it: the refit is the run's own Laplace."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from laplace_lab.train import run
from laplace_lab.training.job_laplace import best_state, final_laplace
from tests.conftest import compose_config, load_script

ROOT = Path(__file__).resolve().parents[2]
JOB = ["data=toy2d", "data.n_train=128", "data.n_test=64", "model=mlp", "model.widths=[8]", "method=online_kron",
       "trainer.max_epochs=3", "marglik.n_steps=5", "logger=csv", "evaluation=none", "trainer.enable_progress_bar=false",
       "torch_num_threads=1"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("job")
    run(compose_config([*JOB, "checkpoint.enabled=true"]), folder)
    return folder


def test_final_laplace_is_the_runs_laplace(job):
    metrics = json.loads((job / "metrics.json").read_text())
    *_, la, refit = final_laplace(job)
    for key in ("laplace/log_marglik", "laplace/log_lik", "laplace/log_det_ratio", "laplace/scatter"):
        assert refit[key] == pytest.approx(metrics[key], rel=1e-5), key
    assert metrics["laplace/log_lik"] - 0.5 * (metrics["laplace/log_det_ratio"] + metrics["laplace/scatter"]) \
        == pytest.approx(metrics["laplace/log_marglik"], rel=1e-6)


def test_marglik_terms_script_recorded_and_refit(job, monkeypatch, capsys):
    script = load_script(ROOT / "experiments" / "immer2021_uci" / "marglik_terms.py")
    recorded, refit = script.job_terms(job), script.job_terms(job, refit=True)
    assert recorded["source"] == "recorded" and refit["source"] == "refit" and refit["params"] == 2 * 8 + 8 + 8 * 2 + 2
    for key in ("log_marglik", "log_lik", "log_det_ratio", "scatter", "occam"):
        assert refit[key] == pytest.approx(recorded[key], rel=1e-5), key
    assert recorded["occam"] < 0 < recorded["log_det_ratio"] and math.isfinite(recorded["log_lik"])
    assert recorded["test_acc"] is None  # evaluation=none: no test metrics, a dash in the table
    table = script.markdown([recorded, refit])
    assert recorded["by_tensor"] is None and list(refit["by_tensor"]) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    assert sum(v for _, v in refit["by_tensor"].values()) == pytest.approx(refit["log_det_ratio"], rel=1e-5)
    split = script.by_tensor_markdown([refit])
    assert split.count("\n") == 5 and "| Toy2DDataModule | MLP [8] | 0 | 1.weight | 16 |" in split
    monkeypatch.setattr(sys, "argv", ["marglik_terms.py", str(job / "checkpoints")])  # not a finished job
    with pytest.raises(SystemExit, match="no finished job"):
        script.main()
    assert "checkpoints: not finished (no metrics.json)" in capsys.readouterr().err
    assert table.count("\n") == 3 and "| Toy2DDataModule | MLP [8] | 0 | 42 |" in table and "| - | - | refit |" in table


def test_jobs_without_the_state_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint.enabled=true"):
        best_state(tmp_path)
    map_job = tmp_path / "map"
    map_overrides = [o for o in JOB if not o.startswith(("method=", "marglik."))]
    run(compose_config([*map_overrides, "method=map", "trainer.max_epochs=1", "checkpoint.enabled=true"]), map_job)
    with pytest.raises(ValueError, match="no online-marglik best state"):
        best_state(map_job)
