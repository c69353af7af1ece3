"""The Immer et al. 2021 UCI peer that runs the paper's code (``experiments/immer2021_uci/peer/marglik_authors_uci.py``,
aleximmer/marglik's ``marglik_optimization``): its recipe is the ``immer2021_uci`` preset's, it hands
that recipe and a full-GGN Laplace to the function of the checkout it is given, and its side=ours rows
come from a jobs CSV."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from laplace_lab.config.load import load_run_config
from laplace_lab.reporting import peer_pairs
from tests.conftest import compose_config, load_script, write_jobs_csv

ROOT = Path(__file__).resolve().parents[2]
PEER = load_script(ROOT / "experiments" / "immer2021_uci" / "peer" / "marglik_authors_uci.py")

# A stand-in for aleximmer/marglik's marglik.py: records its call, fits the Laplace it is given.
FAKE_MARGLIK = '''
import torch
from laplace.curvature import BackPackGGN
CALLS = []

def marglik_optimization(model, train_loader, laplace=None, **kwargs):
    CALLS.append({"laplace": laplace, "default_dtype": torch.get_default_dtype(), **kwargs})
    lap = laplace(model, kwargs["likelihood"], sigma_noise=0.5, prior_precision=torch.ones(4), backend=BackPackGGN)
    lap.fit(train_loader)
    return lap, model, [], []
'''


def test_recipe_is_the_presets():
    cfg = compose_config(["experiment=immer2021_uci", "method=online_full"])
    load_run_config(cfg)
    OmegaConf.resolve(cfg)
    recipe = PEER.RECIPE
    assert (cfg.trainer.max_epochs, cfg.optimizer.lr) == (recipe["n_epochs"], recipe["lr"])
    assert (cfg.marglik.frequency, cfg.marglik.burnin, cfg.marglik.n_steps, cfg.marglik.lr_hyp) == (
        recipe["marglik_frequency"], recipe["n_epochs_burnin"], recipe["n_hypersteps"], recipe["lr_hyp"])
    assert cfg.prior.prior_precision == recipe["prior_prec_init"] and cfg.prior.structure == recipe["prior_structure"]
    assert (cfg.curvature.hessian_structure, list(cfg.model.widths), cfg.model.activation) == ("full", [50], "tanh")
    assert cfg.data.val_fraction == 0.0  # all training rows, as the peer's full batch


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_run_one_calls_the_checkouts_function_with_the_recipe(tmp_path, data_dir, dtype):
    from laplace import FullLaplace

    (tmp_path / "marglik.py").write_text(FAKE_MARGLIK)
    sys.modules.pop("marglik", None)
    try:
        row = PEER.run_one(tmp_path, str(data_dir), "yacht", 0, dtype)
        call = sys.modules["marglik"].CALLS[-1]
    finally:
        sys.modules.pop("marglik", None)
        sys.path.remove(str(tmp_path))
    assert call.pop("laplace") is FullLaplace and call.pop("default_dtype") == getattr(torch, dtype)
    assert call == PEER.RECIPE
    assert torch.get_default_dtype() == torch.float32  # restored after the call
    assert row["hparams/sigma_noise"] == pytest.approx(0.5) and row["error"] == ""
    assert all(math.isfinite(row[m]) for m in PEER.METRICS)


def test_add_ours_keeps_theirs_and_pairs_by_split(tmp_path):
    jobs = write_jobs_csv(tmp_path / "jobs.csv", "immer2021_uci", [
        {"job": f"j{i}", "data.name": "yacht", "method_name": method, "commit": "abc", "dirty": "False",
         "overrides": f"data.name=yacht data.split={i} method={method} experiment=immer2021_uci",
         "test/map/ll": "-1", "test/la/ll": str(-0.5 - i), "test/map/rmse": "0.5", "hparams/sigma_noise": "0.03"}
        for i, method in ((0, "online_full"), (1, "online_full"), (0, "map_grid"))])
    out = tmp_path / "peer.csv"
    out.write_text(PEER.HEADER + ",".join(PEER.COLUMNS) + "\n")
    for split in (0, 1):
        theirs = {"side": "theirs", "seed": split, "commit": "c0ffee", "command": PEER.command_of("yacht", split, "float32"),
                  "data": "yacht", "method": "online_full", "dtype": "float32", "test/la/ll": -0.6 - split}
        _append(out, theirs)
    PEER.add_ours(out, jobs)
    PEER.add_ours(out, jobs)  # again: replaced, not doubled
    table = peer_pairs.read_peer_csv(out)
    assert [r["side"] for r in table.rows] == ["theirs", "theirs", "ours", "ours"]  # map_grid left out
    values = peer_pairs.side_values(table, {"data": "yacht", "method": "online_full"}, "test/la/ll", "t")
    mean, _, n, _ = peer_pairs.paired(values)
    assert n == 2 and mean == pytest.approx(0.1)


def _append(out: Path, row: dict) -> None:
    from laplace_lab.reporting.peer_csv import append_row

    append_row(out, row, PEER.COLUMNS, extrasaction="ignore")
