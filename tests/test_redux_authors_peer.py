"""experiments/redux_mnist/peer/run_authors_uq.py: our LeNet in the authors' layout gives the same
logits, the run-time patch applies exactly once (else stops), uq.py's results and our metrics map to
the peer CSV's columns, and the committed CSV names no machine path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from laplace_lab.models.lenet import LeNet
from laplace_lab.reporting import peer_pairs
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "redux_mnist" / "peer" / "run_authors_uq.py"


@pytest.fixture(scope="module")
def peer():
    return load_script(SCRIPT, "run_authors_uq")


def authors_layout() -> torch.nn.Sequential:
    """The layer list of the Laplace Redux LeNet (conv6-pool-conv16-pool-fc120-fc84-fc10)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84),
        torch.nn.ReLU(), torch.nn.Linear(84, 10))


def test_our_lenet_in_the_authors_layout_gives_the_same_logits(peer):
    torch.manual_seed(0)
    ours = LeNet((1, 28, 28), 10).eval()
    theirs = authors_layout().eval()
    theirs.load_state_dict(peer.to_authors_state_dict(ours))
    x = torch.rand(4, 1, 28, 28)
    assert torch.equal(ours(x), theirs(x))
    with pytest.raises(ValueError, match="not the Laplace Redux LeNet"):
        peer.to_authors_state_dict(LeNet((3, 32, 32), 10))


def test_patch_applies_once_or_stops(peer, tmp_path):
    rel, old, new = peer.PATCH[2]
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text("x = 1\n" + old + "y = 2\n")
    peer.apply_patch(tmp_path, [peer.PATCH[2]])
    assert (tmp_path / rel).read_text() == "x = 1\n" + new + "y = 2\n"
    with pytest.raises(RuntimeError, match="patch does not apply: utils/data_utils.py has 0 copies"):
        peer.apply_patch(tmp_path, [peer.PATCH[2]])
    assert "+            ids = ['MNIST', 'FMNIST']" in peer.patch_diff()


def test_results_and_metrics_map_to_the_csv_columns(peer):
    r_mnist = [{"acc": 0.99, "nll": 0.03, "conf": 0.98, "brier": 0.01, "ece": 0.05}] + [{"conf": 0.5}] * 12
    ood = [{"conf": 0.98}, {"conf": 0.6, "auroc": 0.97, "fpr95": 0.1}]
    row = peer.theirs_row({"R-MNIST": r_mnist, "MNIST-OOD": ood})
    assert row["test/ece_redux"] == 0.05 and row["ood/fashion_mnist/auroc"] == 0.97 and row["test/acc"] == 0.99
    metrics = {"test/la/acc": 0.9, "test/map/acc": 0.8, "ood/fashion_mnist/la/conf": 0.5}
    assert peer.ours_row(metrics, "la")["test/acc"] == 0.9 and peer.ours_row(metrics, "map")["test/acc"] == 0.8
    assert peer.ours_row(metrics, "la_star")["ood/fashion_mnist/conf"] == 0.5
    assert peer.ours_row(metrics, "map")["test/nll"] == ""          # not computed: an empty cell
    assert set(peer.COLUMNS) >= set(peer_pairs.REQUIRED_COLUMNS)


@pytest.mark.parametrize("csv_path", sorted((ROOT / "experiments").glob("*/peer/*.csv")), ids=lambda p: p.name)
def test_committed_peer_csvs_are_valid_and_portable(csv_path):
    table = peer_pairs.read_peer_csv(csv_path)
    assert not re.search(r"/work/|\.\./shared|/home/\w+|/Users/\w+|/root/|/tmp/", csv_path.read_text()), csv_path
    sides = {(r["side"], r["seed"]) for r in table.rows}
    assert {s for side, s in sides if side == "theirs"} == {s for side, s in sides if side == "ours"}, csv_path


def test_laplace_torch_rows_pair_with_the_table_jobs():
    pairs = load_script(SCRIPT.with_name("laplace_torch_pairs.py"))
    metrics = {v: "0.5" for v in [*pairs.METRICS.values(), *pairs.MAP_CHECK]}
    peer_rows = [{"seed": "3", "method_name": "la", **metrics}, {"seed": "3", "method_name": "kron", **metrics}]
    our_rows = [{"method_name": "la", "overrides": "method=la seed=3 experiment=redux_mnist", "commit": "abc", **metrics}]
    rows = pairs.pairs(peer_rows, our_rows, {"3": "def"})
    assert [(r["side"], r["seed"], r["method"], r["commit"]) for r in rows] == [("ours", "3", "la", "abc"),
                                                                                 ("theirs", "3", "la", "def")]
    assert rows[0]["command"] == "python -m laplace_lab.train method=la seed=3 experiment=redux_mnist"
    assert rows[1]["test/nll"] == "0.5" and set(rows[1]) == set(pairs.COLUMNS)
    other_network = [{**our_rows[0], "test/map/nll": "0.6"}]
    with pytest.raises(ValueError, match=r"seed 3: the laplace-torch row's MAP metrics \['test/map/nll'\] differ"):
        pairs.pairs(peer_rows, other_network, {"3": "def"})
