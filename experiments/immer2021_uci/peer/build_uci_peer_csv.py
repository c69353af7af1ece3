"""Writes ``laplace_torch_uci.csv`` (the peer format of ``laplace_lab.reporting.peer_pairs``) for the
``immer2021_uci`` table: the authors' algorithm as laplace-torch 0.3's ``marglik_training`` run on
our splits (``experiments/immer2021_uci/laplace_torch_reference.csv``, made by
``laplace_torch_reference.py``; naval-propulsion-plant: its float64 rows, float32 fails) and our
``online_full`` jobs of the committed table (``results/immer2021_uci.jobs.csv``), seed = split.

    python experiments/immer2021_uci/peer/build_uci_peer_csv.py
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))
from laplace_lab.reporting.peer_csv import seal  # noqa: E402
from laplace_lab.reporting.peer_ours import ours_rows  # noqa: E402

HERE = Path(__file__).resolve().parent
COLUMNS = ["side", "seed", "commit", "command", "data", "method", "dtype", "test/la/ll", "test/map/ll"]
THEIRS_COMMAND = ("PYTHONPATH=src python experiments/immer2021_uci/laplace_torch_reference.py --sets {data} "
                  "--splits {split} --dtype {dtype}")


def theirs_rows() -> list[dict[str, str]]:
    out = []
    with (HERE.parent / "laplace_torch_reference.csv").open() as f:
        for rec in csv.DictReader(f):
            if rec.get("error") or not math.isfinite(float(rec["test_la_ll"])):
                continue  # laplace-torch's float32 run failed (naval): no row
            dtype = rec.get("dtype") or "float32"
            out.append({"side": "theirs", "seed": rec["data.split"], "commit": "laplace-torch 0.3 (PyPI)",
                        "command": THEIRS_COMMAND.format(data=rec["data.name"], split=rec["data.split"], dtype=dtype),
                        "data": rec["data.name"], "method": "online_full", "dtype": dtype,
                        "test/la/ll": rec["test_la_ll"], "test/map/ll": rec["test_map_ll"]})
    return out


def main() -> None:
    ours = ours_rows(ROOT / "results" / "immer2021_uci.jobs.csv", seed_key="data.split",
                     settings={"data": "data.name", "method": "method_name"},
                     metrics={"test/la/ll": "test/la/ll", "test/map/ll": "test/map/ll"},
                     where={"method_name": "online_full"})
    for row in ours:
        row["dtype"] = "float32"
    out = HERE / "laplace_torch_uci.csv"
    with out.open("w", newline="") as f:
        f.write("# immer2021_uci peer: laplace-torch 0.3 marglik_training (the authors' algorithm, used as a\n"
                "# library) on our splits with the same recipe, against our online_full jobs; seed = split.\n"
                "# Written by experiments/immer2021_uci/peer/build_uci_peer_csv.py from\n"
                "# experiments/immer2021_uci/laplace_torch_reference.csv and results/immer2021_uci.jobs.csv.\n")
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(ours + theirs_rows())
    seal(out)  # the row count last: a cut-off file is refused
    print(f"wrote {out} ({len(ours)} ours rows)")


if __name__ == "__main__":
    main()
