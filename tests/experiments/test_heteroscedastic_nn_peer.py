"""The Immer et al. 2023 peer (``experiments/heteroscedastic_uci/peer/heteroscedastic_nn_peer.py``): its
side=ours rows come from a ``heteroscedastic_uci`` jobs CSV, for the splits the authors' code runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from laplace_lab.reporting import peer_pairs
from tests.conftest import load_script, write_jobs_csv

ROOT = Path(__file__).resolve().parents[2]
PEER = load_script(ROOT / "experiments" / "heteroscedastic_uci" / "peer" / "heteroscedastic_nn_peer.py")
METRICS = ("test/map/ll", "test/la/ll", "test/map/rmse", "test/la_het_mean/ll")


def _jobs_csv(path: Path) -> Path:
    rows = []
    for i, (split, method) in enumerate([(0, "het_online"), (5, "het_online"), (0, "map_grid")]):
        rows.append({"job": f"j{i}", "data.name": "yacht", "method_name": method,
                     "overrides": f"data.name=yacht data.split={split} method={method} experiment=heteroscedastic_uci",
                     "commit": "abc123", "dirty": "False", "wall_s": "10"}
                    | {m: str(-0.1 * (i + 1)) for m in METRICS})
    return write_jobs_csv(path, "heteroscedastic_uci", rows)


def test_add_ours_keeps_the_peers_splits_and_theirs_rows(tmp_path):
    out = tmp_path / "peer.csv"
    PEER.ensure_header(out)
    with out.open("a", newline="") as f:
        csv.DictWriter(f, PEER.COLUMNS).writerow({k: "" for k in PEER.COLUMNS} | {
            "side": "theirs", "seed": 0, "commit": "95f0bef", "command": "x", "data": "yacht", "method": "het_online",
            "test/la/ll": -0.5})
    jobs = _jobs_csv(tmp_path / "jobs.csv")
    PEER.add_ours(out, [jobs], splits=[0, 1, 2])
    PEER.add_ours(out, [jobs], splits=[0, 1, 2])  # again: replaced, not doubled
    table = peer_pairs.read_peer_csv(out)
    # split 5 is ours only (the authors' code ran splits 0-2): left out, so both sides hold the same splits
    assert sorted((r["side"], r["method"], r["seed"]) for r in table.rows) == [
        ("ours", "het_online", "0"), ("ours", "map_grid", "0"), ("theirs", "het_online", "0")]
    values = peer_pairs.side_values(table, {"data": "yacht", "method": "het_online"}, "test/la/ll", "test")
    assert values == {"ours": {0: pytest.approx(-0.1)}, "theirs": {0: pytest.approx(-0.5)}}
    PEER.add_ours(out, [jobs])  # no split filter: every job
    assert sum(r["side"] == "ours" for r in peer_pairs.read_peer_csv(out).rows) == 3
