"""The laplace-torch peer of the committed ``redux_mnist`` table as a paired peer CSV
(``laplace_lab.reporting.peer_pairs``): ``laplace_torch_100ep.csv``.

``../laplace_torch_reference.csv`` holds laplace-torch 0.3 (the authors' library, with the settings
of the authors' ``uq.py``: ``configs/post_hoc_laplace/mnist_{default,bestood}.yaml``) fitted on the
table's five 100-epoch MAP networks and evaluated by our evaluation code; ``results/redux_mnist.jobs.csv``
holds our jobs on the same networks. This script pairs them seed by seed (methods ``la`` and
``la_star``; metric columns named without the predictor, as ``authors_uq.csv``). It computes nothing:
it reshapes two committed files. From the repository root::

    python experiments/redux_mnist/peer/laplace_torch_pairs.py
"""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PEER = HERE.parent / "laplace_torch_reference.csv"
OURS = ROOT / "results" / "redux_mnist.jobs.csv"
OUT = HERE / "laplace_torch_100ep.csv"
METHODS = ("la", "la_star")
METRICS = {"test/acc": "test/la/acc", "test/nll": "test/la/nll", "test/ece": "test/la/ece",
           "test/brier": "test/la/brier", "ood/fashion_mnist/conf": "ood/fashion_mnist/la/conf",
           "ood/fashion_mnist/auroc": "ood/fashion_mnist/la/auroc"}
COLUMNS = ["side", "seed", "method", "commit", "command", *METRICS]
PEER_COMMAND = "python experiments/redux_mnist/laplace_torch_reference.py --sweep-dir <redux_mnist sweep> --methods la,la_star"


def read(path: Path) -> list[dict]:
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def row_commits(path: Path = PEER) -> dict[str, str]:
    """``{seed: commit}``: the commit that added each seed's laplace-torch rows to ``path``."""
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--reverse", "--format=%H", "--", str(path.relative_to(ROOT))],
                         capture_output=True, text=True, check=True).stdout.split()
    commits: dict[str, str] = {}
    for commit in log:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path.relative_to(ROOT)}"],
                              capture_output=True, text=True).stdout
        for r in csv.DictReader(text.splitlines()):
            commits.setdefault(r["seed"], commit)
    return commits


MAP_CHECK = ("test/map/acc", "test/map/nll", "ood/fashion_mnist/map/conf")  # same network on both sides


def check_same_networks(peer_rows: list[dict], our_rows: list[dict], tol: float = 1e-6) -> None:
    """Both sides' MAP metrics must agree per seed (else the laplace-torch rows are of other networks,
    e.g. the table was rerun: rerun ../laplace_torch_reference.py on its sweep first)."""
    ours = {next(t.split("=")[1] for t in r["overrides"].split() if t.startswith("seed=")): r for r in our_rows}
    for r in peer_rows:
        mine = ours.get(r["seed"])
        bad = [k for k in MAP_CHECK if mine is not None and abs(float(r[k]) - float(mine[k])) > tol]
        if mine is None or bad:
            raise ValueError(f"seed {r['seed']}: the laplace-torch row's MAP metrics {bad or '(no job)'} differ from "
                             "the table's job: not the same MAP network")


def pairs(peer_rows: list[dict], our_rows: list[dict], commits: dict[str, str]) -> list[dict]:
    check_same_networks(peer_rows, our_rows)
    out = []
    for r in peer_rows:
        if r["method_name"] not in METHODS:
            continue
        out.append({"side": "theirs", "seed": r["seed"], "method": r["method_name"], "commit": commits[r["seed"]],
                    "command": f"{PEER_COMMAND} (laplace-torch 0.3)", **{k: r[v] for k, v in METRICS.items()}})
    for r in our_rows:
        if r["method_name"] not in METHODS:
            continue
        seed = next(t.split("=")[1] for t in r["overrides"].split() if t.startswith("seed="))
        out.append({"side": "ours", "seed": seed, "method": r["method_name"], "commit": r["commit"],
                    "command": "python -m laplace_lab.train " + r["overrides"], **{k: r[v] for k, v in METRICS.items()}})
    return sorted(out, key=lambda r: (r["side"], int(r["seed"]), r["method"]))


def main() -> None:
    rows = pairs(read(PEER), read(OURS), row_commits())
    header = ["laplace-torch 0.3 (the authors' library; uq.py's LA / LA* settings, evaluated by our code) vs our "
              "redux_mnist jobs on the table's 100-epoch MAP networks, seeds 0-4, all 10k test images",
              f"theirs: experiments/redux_mnist/laplace_torch_reference.csv (commit: the one that added the row); "
              f"ours: results/redux_mnist.jobs.csv; made by: python experiments/redux_mnist/peer/{Path(__file__).name}"]
    with OUT.open("w", newline="") as f:
        f.writelines(f"# {line}\n" for line in header)
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    from laplace_lab.reporting.peer_csv import seal

    seal(OUT)  # the row count last: a cut-off file is refused
    print(OUT)


if __name__ == "__main__":
    main()
