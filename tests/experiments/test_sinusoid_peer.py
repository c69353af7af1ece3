"""experiments/sinusoid/peer/laplace_torch_example.py: our sinusoid job and laplace-torch's
regression-example recipe on the same network, smoke-sized (1 seed, 3 epochs, 3 hyper steps),
written as a peer CSV that ``peer_pairs`` reads; bad options are refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from laplace_lab.reporting import peer_pairs
from tests.conftest import load_script

pytest.importorskip("laplace")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "sinusoid" / "peer" / "laplace_torch_example.py"


@pytest.fixture(scope="module")
def peer():
    return load_script(SCRIPT, "sinusoid_peer")


def test_parse_seeds(peer):
    assert peer.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert peer.parse_seeds("0,2") == [0, 2]
    for bad in ("4-0", "a", "1-b"):
        with pytest.raises(ValueError, match="--seeds"):
            peer.parse_seeds(bad)


@pytest.mark.parametrize("argv, message", [(["--seeds", "x"], "--seeds"), (["--epochs", "0"], "--epochs"),
                                           (["--hyper-steps", "-1"], "--hyper-steps")])
def test_bad_options_are_refused(peer, argv, message, capsys):
    with pytest.raises(SystemExit):
        peer.main(argv)
    assert message in capsys.readouterr().err


def test_smoke_writes_a_peer_csv_on_one_network(peer, tmp_path):
    out = tmp_path / "peer.csv"
    peer.main(["--seeds", "0", "--epochs", "3", "--hyper-steps", "3", "--out", str(out)])
    table = peer_pairs.read_peer_csv(out)
    assert {r["side"] for r in table.rows} == {"ours", "theirs"}
    assert all(r["method"] == "posthoc_full_ggn" for r in table.rows)
    for metric in peer.METRICS:
        values = peer_pairs.side_values(table, {"method": "posthoc_full_ggn"}, metric, "test")
        assert set(values["ours"]) == set(values["theirs"]) == {0}
    # same network on both sides: the MAP plug-in test LL is the same number
    map_ll = peer_pairs.side_values(table, {}, "test/map/ll", "test")
    assert map_ll["ours"][0] == pytest.approx(map_ll["theirs"][0], abs=1e-6)
    theirs = next(r for r in table.rows if r["side"] == "theirs")
    assert theirs["commit"].startswith("laplace-torch==")
