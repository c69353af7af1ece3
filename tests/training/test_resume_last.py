"""``checkpoint.resume_from=last``: a run cut off mid-training continues from its own last.ckpt
when run again in the same folder, and ends where an uninterrupted run ends (online marglik, and
``map_grid``, whose grid points each resume from their own checkpoint)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl

import laplace_lab.training.fit as fit_module
from laplace_lab.config.load import load_run_config
from laplace_lab.train import run
from laplace_lab.training.resume import resume_path
from tests.conftest import compose_config, run_config

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = ["logger=csv", "trainer.enable_progress_bar=false", "evaluation=regression", "evaluation.progress=false"]
BASE = ["data=sinusoid", "model=mlp", "model.widths=[20]", "model.activation=tanh", "optimizer.lr=1e-2",
        "data.batch_size=32", "lr_scheduler=cosine_per_step", "trainer.max_epochs=8", *QUIET]
ONLINE = ["method=online_full", "marglik.frequency=2", "marglik.n_steps=10", "marglik.burnin=2",
          "marglik.early_stopping=true"]
GRID = ["method=map_grid", "map_grid=[0.1,10.0]"]
RESUME = ["checkpoint.enabled=true", "checkpoint.resume_from=last"]


class Cut(RuntimeError):
    pass


class CutAt(pl.Callback):
    """Raises ``Cut`` at the start of the ``n``-th training epoch of the whole run (counted over
    the trainings of a grid), as a killed process would stop."""

    seen = 0

    def __init__(self, n: int):
        self.n = n

    def on_train_epoch_start(self, trainer, module):
        CutAt.seen += 1
        if CutAt.seen == self.n:
            raise Cut(f"cut at epoch start {self.n}")


def _cut_run(overrides: list[str], out, at: int, monkeypatch) -> None:
    """Run ``overrides`` in ``out`` and cut it at the start of its ``at``-th training epoch."""
    build = fit_module.build_callbacks
    CutAt.seen = 0
    monkeypatch.setattr(fit_module, "build_callbacks",
                        lambda cfg, o, loop="lightning": [*build(cfg, o, loop), CutAt(at)])
    with pytest.raises(Cut):
        run(compose_config(overrides), out)
    monkeypatch.setattr(fit_module, "build_callbacks", build)


def _comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if "time" not in k and not k.startswith("checkpoint/")}


@pytest.mark.parametrize("method, cut_at", [(ONLINE, 5), (GRID, 11)], ids=["online-marglik", "map-grid"])
def test_cut_run_resumes_to_the_same_end(method, cut_at, tmp_path, monkeypatch):
    overrides = [*BASE, *method, *RESUME]
    whole = run(compose_config(overrides), tmp_path / "whole")

    _cut_run(overrides, tmp_path / "cut", cut_at, monkeypatch)
    resumed = run(compose_config(overrides), tmp_path / "cut")

    assert resumed["checkpoint/resumed_fit_s"] > 0  # the last training resumed from a checkpoint
    assert resumed["time/fit_s"] >= resumed["checkpoint/resumed_fit_s"]
    assert _comparable(resumed) == _comparable(whole)  # every final metric, bit for bit
    if method is GRID:  # each grid point wrote its own checkpoints
        assert sorted(p.parent.parent.name for p in (tmp_path / "cut").glob("grid_*/checkpoints/last.ckpt")) == [
            "grid_0.1", "grid_10"]


def test_without_resume_a_cut_run_starts_again(tmp_path, monkeypatch):
    """The control: with resume_from=null the same second launch trains from the start."""
    overrides = [*BASE, *ONLINE, "checkpoint.enabled=true"]
    _cut_run(overrides, tmp_path, 5, monkeypatch)
    assert "checkpoint/resumed_fit_s" not in run(compose_config(overrides), tmp_path)


def test_resume_path(tmp_path):
    cfg = run_config(["data=sinusoid", *RESUME])
    assert resume_path(cfg, tmp_path) is None  # nothing saved yet: a fresh start
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert resume_path(cfg, tmp_path) == str(tmp_path / "checkpoints" / "last.ckpt")
    cfg = run_config(["data=sinusoid", *RESUME, f"checkpoint.dirpath={tmp_path / 'elsewhere'}"])
    assert resume_path(cfg, tmp_path) is None
    (tmp_path / "y.ckpt").write_bytes(b"")  # (a path must exist: config.validation)
    assert resume_path(run_config([f"checkpoint.resume_from={tmp_path / 'y.ckpt'}"]), tmp_path) == str(tmp_path / "y.ckpt")
    assert resume_path(run_config([]), tmp_path) is None


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.resume_from=last"], r"checkpoint.resume_from=last .* checkpoint.enabled=true"),
    ([*GRID, "checkpoint.resume_from=/x/y.ckpt"], r"with map_grid: .* allowed: checkpoint.resume_from=last"),
])
def test_bad_resume_options_fail_before_any_work(overrides, message, tmp_path):
    cfg = compose_config(["data=sinusoid", *overrides])
    with pytest.raises(ValueError, match=message):
        load_run_config(cfg)
    with pytest.raises(ValueError, match=message):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_last_refuses_a_checkpoint_of_another_config(tmp_path, monkeypatch):
    """``last`` continues the same run: another learning rate is refused (a path may start a new
    run from the same checkpoint: only seed, data and model must match)."""
    overrides = [*BASE, *ONLINE, *RESUME]
    _cut_run(overrides, tmp_path / "cut", 5, monkeypatch)
    with pytest.raises(ValueError, match=r"resume_from=last: .* another config or code"):
        run(compose_config([*overrides, "optimizer.lr=5e-3"]), tmp_path / "cut")
    path = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    metrics = run(compose_config([*BASE, *ONLINE, "optimizer.lr=5e-3", f"checkpoint.resume_from={path}"]),
                  tmp_path / "new")
    assert metrics["checkpoint/resumed_fit_s"] > 0


def test_grid_points_get_their_own_explicit_checkpoint_dirpath(tmp_path):
    """With checkpoint.dirpath set, map_grid's trainings write (and resume) under <dirpath>/<name>."""
    from laplace_lab.training.map_grid import grid_point_config, grid_point_name, refit_config

    cfg = run_config(["data=uci", "data.name=yacht", *GRID, "map_grid_refit=true", f"checkpoint.dirpath={tmp_path}"])
    assert grid_point_config(cfg, 0.1, grid_point_name(0.1)).checkpoint.dirpath == str(tmp_path / "grid_0.1")
    assert refit_config(cfg, 10.0).checkpoint.dirpath == str(tmp_path / "refit")
    assert cfg.checkpoint.dirpath == str(tmp_path)  # the run's own config is left as it was
