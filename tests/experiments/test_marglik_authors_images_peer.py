"""The Immer et al. 2021 images peer that runs the paper's code
(``experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py``, aleximmer/marglik's
``marglik_optimization``): the preset's recipe mapped onto the function's arguments, the four
candidates composed as our jobs compose them, the evidence cells of a Laplace, and side=ours rows
from a jobs CSV (MLP widths named as candidates). The authors' code itself is not run here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from laplace_lab.reporting import peer_pairs
from tests.conftest import load_script, write_jobs_csv

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "experiments" / "immer2021_images_peer_cut" / "peer"
PEER = load_script(FOLDER / "marglik_authors_images.py")
LAPLACE_TORCH_PEER = load_script(FOLDER / "marglik_images_peer.py")


def test_call_arguments_are_the_presets_recipe_on_the_functions_names():
    args = PEER.call_arguments(LAPLACE_TORCH_PEER.RECIPE, epochs=10)
    assert args == {"likelihood": "classification", "prior_structure": "layerwise", "prior_prec_init": 27.5,
                    "n_epochs": 10, "lr": 1e-3, "lr_min": 1e-6, "scheduler": "cos", "lr_hyp": 1.0}
    # K, F and B are left at the function's defaults (100, 1, 0): a recipe that differs must say so
    with pytest.raises(ValueError, match=r"recipe \{'n_hypersteps': 50\} differs from marglik_optimization's defaults"):
        PEER.call_arguments({**LAPLACE_TORCH_PEER.RECIPE, "n_hypersteps": 50}, epochs=10)


@pytest.mark.parametrize("name, sizes", [("mlp_50", [(50, 784), (10, 50)]),
                                         ("mlp_100_100", [(100, 784), (100, 100), (10, 100)]),
                                         ("mlp_500_300", [(500, 784), (300, 500), (10, 300)])])
def test_candidates_compose_the_networks_our_jobs_train(name, sizes):
    model = LAPLACE_TORCH_PEER.build_model(name, (1, 28, 28), 10, overrides=PEER.CANDIDATES[name])
    weights = [tuple(p.shape) for n, p in model.named_parameters() if p.ndim == 2]
    assert weights == sizes


def test_laplace_row_is_the_evidence_and_its_terms():
    la = SimpleNamespace(log_marginal_likelihood=lambda: torch.tensor(-10.0), log_likelihood=torch.tensor(-4.0),
                         log_det_ratio=torch.tensor(8.0), scatter=torch.tensor(4.0),
                         prior_precision=torch.tensor([1.0, 3.0]))
    assert PEER.laplace_row(la) == {"laplace/log_marglik": -10.0, "laplace/log_lik": -4.0,
                                    "laplace/log_det_ratio": 8.0, "laplace/scatter": 4.0,
                                    "hparams/prior_precision_mean": 2.0}


def test_commands_and_headers_carry_no_path_of_this_machine():
    argv = ["--repo", "/tmp/x/marglik", "--data", "mnist", "--data-dir=/data", "--out", "/tmp/o.csv"]
    assert PEER.portable_argv(argv) == ["--repo", "<aleximmer/marglik>", "--data", "mnist", "--data-dir=<data dir>",
                                        "--out", "<out>"]
    assert PEER.command_of("mnist", "mlp_50", 2, 5000, 10).endswith(
        "--repo <aleximmer/marglik> --data mnist --models mlp_50 --seeds 2 --n-train 5000 --epochs 10")


def _jobs(path: Path) -> Path:
    base = {"data.name": "fashion_mnist", "method_name": "online_kron", "commit": "abc123", "dirty": "False",
            "wall_s": "30", **{m: "-1.5" for m in PEER.OURS_METRICS.values()}}
    rows = [dict(base, job="a", model="mlp", **{"model.widths": "[50]"},
                 overrides="data=fashion_mnist model=mlp seed=1 'model.widths=[50]'"),
            dict(base, job="b", model="mlp", **{"model.widths": "[100,100]"},
                 overrides="data=fashion_mnist model=mlp seed=0 'model.widths=[100,100]'"),
            dict(base, job="c", model="lenet", **{"model.widths": ""}, overrides="data=fashion_mnist model=lenet seed=2"),
            dict(base, job="d", model="mlp_500_300", **{"model.widths": "[500,300]"},
                 overrides="data=fashion_mnist model=mlp_500_300 seed=2"),
            dict(base, job="e", model="lenet", method_name="map_wd", **{"model.widths": ""},
                 overrides="data=fashion_mnist model=lenet method=map_wd")]
    return write_jobs_csv(path, "immer2021_images_peer_cut", rows)


def test_ours_rows_name_the_candidates(tmp_path):
    rows = PEER.ours_peer_rows(_jobs(tmp_path / "jobs.csv"), n_train=5000, epochs=10)
    assert [(r["model"], r["seed"]) for r in rows] == [("mlp_50", "1"), ("mlp_100_100", "0"), ("lenet", "2"),
                                                       ("mlp_500_300", "2")]  # map_wd left out
    assert rows[0]["hparams/prior_precision_mean"] == "-1.5" and "widths" not in rows[0]
    with pytest.raises(ValueError, match=r"model='mlp' model.widths='\[7\]' is none of the candidates"):
        PEER.candidate_of("mlp", "[7]")


def test_add_ours_beside_the_authors_rows(tmp_path):
    out = tmp_path / "peer.csv"
    PEER.start_csv(out, "python marglik_authors_images.py", "abc123", "a jobs CSV")
    theirs = {k: "" for k in PEER.FIELDS} | {"side": "theirs", "seed": 1, "commit": "050b026", "command": "x",
                                             "data": "fashion_mnist", "model": "mlp_50", "n_train": 5000, "epochs": 10,
                                             "laplace/log_marglik": -2.0}
    from laplace_lab.reporting.peer_csv import append_row

    append_row(out, theirs, PEER.FIELDS, counted=True)
    PEER.add_ours(out, _jobs(tmp_path / "jobs.csv"), 5000, 10)
    table = peer_pairs.read_peer_csv(out)
    assert [r["side"] for r in table.rows] == ["theirs", "ours", "ours", "ours", "ours"]
    values = peer_pairs.side_values(table, {"data": "fashion_mnist", "model": "mlp_50"}, "laplace/log_marglik", "t")
    assert values == {"ours": {1: -1.5}, "theirs": {1: -2.0}}
    assert any("aleximmer/marglik" in c for c in table.comments)
    PEER.add_ours(out, _jobs(tmp_path / "jobs.csv"), 5000, 10, ours_from="jobs of one launch")
    table = peer_pairs.read_peer_csv(out)
    assert [c for c in table.comments if c.startswith("side 'ours' rows:")] == [
        "side 'ours' rows: jobs of one launch (their commit and command in the row, written by --add-ours)."]
    assert len(table.rows) == 5


def test_selection_per_side_and_seed():
    def row(side, seed, model, lml, acc):
        return {"data": "fashion_mnist", "side": side, "seed": str(seed), "model": model,
                "laplace/log_marglik": str(lml), "test/map/acc": str(acc)}

    rows = [row("ours", 0, "lenet", -10, 0.9), row("ours", 0, "mlp_50", -5, 0.8), row("ours", 0, "mlp_100_100", -7, 0.85),
            row("theirs", 0, "lenet", -1, 0.9), row("theirs", 0, "mlp_50", -5, 0.8),
            row("theirs", 1, "lenet", "", 0.9)]  # an empty score is left out
    out = PEER.selection(rows)
    assert [(s["side"], s["seed"], s["selected"], s["best"], s["tau"]) for s in out] == [
        ("ours", 0, "mlp_50", "lenet", -1.0), ("theirs", 0, "lenet", "lenet", 1.0)]


def test_rows_already_run_are_skipped(tmp_path):
    out = tmp_path / "peer.csv"
    assert LAPLACE_TORCH_PEER.done_jobs(out) == set()
    PEER.start_csv(out, "python marglik_authors_images.py", "abc123", "none yet")
    from laplace_lab.reporting.peer_csv import append_row

    row = {k: "" for k in PEER.FIELDS} | {"side": "theirs", "seed": 2, "commit": "050b026", "command": "x",
                                          "data": "mnist", "model": "mlp_50", "n_train": 5000, "epochs": 10}
    append_row(out, row, PEER.FIELDS, counted=True)
    append_row(out, row | {"side": "ours", "seed": 1}, PEER.FIELDS, counted=True)
    assert LAPLACE_TORCH_PEER.done_jobs(out) == {("mnist", "mlp_50", "2", "5000", "10")}
