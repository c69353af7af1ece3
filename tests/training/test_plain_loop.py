"""The plain loop (``trainer.loop=plain``) against Lightning's Trainer: the same run gives
bit-identical metrics, CSV rows and RNG state; ``auto`` picks it only where it runs the same way;
importing ``laplace_lab.train`` (and a whole plain run) loads no Lightning."""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from laplace_lab.train import run
from laplace_lab.training.loop_choice import choose_loop
from laplace_lab.training.loops import LIGHTNING, PLAIN
from tests.conftest import CONF_DIR, compose_config, run_config

ROOT = CONF_DIR.parent
QUIET = ["logger=csv", "trainer.enable_progress_bar=false", "evaluation=regression", "evaluation.progress=false"]
ONLINE = ["model=mlp", "model.widths=[50]", "model.activation=tanh", "method=online_full", "optimizer.lr=1e-2"]
HEAVY = ("pytorch_lightning", "lightning_fabric", "lightning", "torchmetrics", "torchvision", "wandb", "seaborn",
         "scipy", "ray", "matplotlib", "torch._dynamo")


def _timeless(row: dict) -> dict:
    return {k: v for k, v in row.items() if "time" not in k}


def _run(overrides: list[str], loop: str, out: Path):
    metrics = run(compose_config([*overrides, f"trainer.loop={loop}"]), out)
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    return _timeless(metrics), [_timeless(r) for r in rows], torch.get_rng_state()


def _assert_same_run(overrides: list[str], tmp_path: Path) -> dict:
    lightning = _run(overrides, "lightning", tmp_path / "lightning")
    plain = _run(overrides, "plain", tmp_path / "plain")
    assert plain[0] == lightning[0]  # every final metric, bit for bit
    assert len(plain[1]) == len(lightning[1]) and plain[1] == lightning[1]  # csv rows, columns and cadence
    diff = (plain[2] != lightning[2]).nonzero().flatten().tolist()
    assert not diff, (diff[:20], plain[2].sum(), lightning[2].sum())  # the same RNG draws (loader iterators, MC samples)
    assert json.loads((tmp_path / "plain" / "status.json").read_text())["devices"]["accelerator"] == "cpu"
    return plain[0]


def test_yacht_online_marglik_identical(tmp_path, data_dir):
    """Mini-batches (32), a validation split, cosine lr schedule, online marglik with burn-in."""
    metrics = _assert_same_run(
        ["data=uci", "data.name=yacht", f"paths.data_dir={data_dir}", *ONLINE, "trainer.max_epochs=60",
         "marglik.frequency=10", "marglik.n_steps=50", "marglik.burnin=20", "lr_scheduler=cosine", *QUIET], tmp_path)
    assert metrics["marglik/accepted_steps"] > 0 and "hparams/sigma_noise" in metrics


@pytest.mark.parametrize("extra", [
    ["data.n_val=50", "+trainer.check_val_every_n_epoch=7", "trainer.log_every_n_steps=3"],
    ["data.n_val=0", "on_nonfinite_loss=skip"],  # full batch, no validation (the shape of benchmarks/e2e_small.py)
    ["data.batch_size=32", "lr_scheduler=cosine_per_step"],  # lr stepped after every batch
], ids=["val-every-7", "no-val", "per-step-cosine"])
def test_sinusoid_online_marglik_identical(extra, tmp_path):
    _assert_same_run(["data=sinusoid", *ONLINE, "trainer.max_epochs=40", "marglik.frequency=10",
                      "marglik.n_steps=20", "marglik.burnin=10", *QUIET, *extra], tmp_path)


@pytest.mark.parametrize("overrides, loop", [
    (["data=sinusoid", "logger=csv"], "plain"),
    (["data=uci", "logger=csv", "method=online_full"], "plain"),
    (["data=toy2d", "logger=csv", "trainer=cpu"], "plain"),
    (["data=mnist"], "lightning"),
    (["data=sinusoid", "logger.wandb.enabled=true", "logger.wandb.mode=offline"], "plain"),  # its own W&B logger
    (["data=sinusoid", "logger=csv", "checkpoint.enabled=true"], "lightning"),
    (["data=sinusoid", "logger=csv", "trainer.gradient_clip_val=1.0"], "lightning"),
    (["data=sinusoid", "logger=csv", "+trainer.accumulate_grad_batches=2"], "lightning"),
    (["data=sinusoid", "logger=csv", "method=online_kron", "marglik.fused=true", "curvature.type=ef"], "lightning"),
    (["data=mnist", "logger=csv"], "lightning"),
    (["data=sinusoid", "logger=csv", "trainer.loop=lightning"], "lightning"),
])
def test_auto_picks_plain_only_where_it_runs_the_same(overrides, loop):
    assert choose_loop(run_config(overrides)).name == loop


def test_auto_keeps_lightning_on_cuda(monkeypatch):
    """The plain loop's CUDA path is not compared with Lightning here: auto leaves CUDA runs to Lightning."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_loop(run_config(["data=sinusoid", "logger=csv"])) is LIGHTNING
    assert choose_loop(run_config(["data=sinusoid", "logger=csv", "trainer=cpu"])) is PLAIN


def test_plain_refuses_what_needs_lightning(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.loop=plain.*checkpoint.enabled"):
        run(compose_config(["data=sinusoid", "checkpoint.enabled=true", "trainer.loop=plain"]), tmp_path)
    with pytest.raises(ValueError, match=r"trainer.loop='fast'.*allowed: \['auto', 'lightning', 'plain'\]"):
        run(compose_config(["data=sinusoid", "logger=csv", "trainer.loop=fast"]), tmp_path)
    assert not (tmp_path / "config_resolved.yaml").exists()  # both before any work


def _loaded_after(code: str) -> list[str]:
    """The ``HEAVY`` modules loaded after running ``code`` in a fresh interpreter."""
    script = textwrap.dedent(code) + f"\nimport sys; print([m for m in {HEAVY!r} if m in sys.modules])\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_importing_train_loads_no_heavy_module():
    assert _loaded_after("import laplace_lab.train") == []


def test_plain_run_loads_no_lightning(tmp_path):
    """A whole plain run (regression evaluation included): Lightning, torchmetrics, torchvision and
    wandb stay unloaded (seaborn / scipy / matplotlib come with the evaluation's figures)."""
    loaded = _loaded_after(f"""
        from pathlib import Path
        from laplace_lab.train import run
        from tests.conftest import compose_config
        run(compose_config(["data=sinusoid", "trainer.max_epochs=3", "marglik.n_steps=2", "method=online_full",
                            {", ".join(repr(o) for o in QUIET)}]), Path({str(tmp_path)!r}))
    """)
    assert not {"pytorch_lightning", "lightning_fabric", "torchmetrics", "torchvision", "wandb"} & set(loaded)
