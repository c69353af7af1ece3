"""The paper's own code for Immer et al. 2021 (aleximmer/marglik, ``marglik.py``) run on our UCI
splits, one CSV row per set and split, in the peer format of ``laplace_lab.reporting.peer_pairs``.

aleximmer/marglik holds Algorithm 1 as one function, ``marglik_optimization`` (training, online
hyperparameter steps, early stopping on the marginal likelihood), built on laplace-torch; it has
no data loading, no experiment scripts and no evaluation code. This script imports that function
from a checkout of the repository (``--repo``, never copied here) and calls it unmodified with the
``immer2021_uci`` preset's recipe; the pieces it has to supply are ours and are the same as the
laplace-torch peer's (``../laplace_torch_reference.py``):

- data: ``laplace_lab.data.UCIDataModule`` (standard split k, inputs and targets standardised with
  the split's training statistics, all training rows), one full batch, seed 0 for the network;
- call: ``marglik_optimization(model, loader, likelihood='regression', prior_structure='layerwise',
  prior_prec_init=1, sigma_noise_init=1, n_epochs=1000, lr=1e-2, n_epochs_burnin=100,
  marglik_frequency=50, n_hypersteps=50, lr_hyp=0.1, laplace=FullLaplace)``; everything else at
  the function's defaults (Adam; ``scheduler='exp'`` with ``lr_min=None``, i.e. no decay;
  ``backend=AsdlGGN``; temperature 1). Differs from the defaults: ``laplace`` (theirs: KronLaplace;
  the preset uses the full GGN) and ``n_hypersteps`` (theirs: 100; the preset's K = 50);
- evaluation: laplace-torch's GLM predictive of the Laplace the function returns (best-marglik
  weights, prior and sigma), plus sigma^2, and the plug-in network with sigma^2, scored by
  ``laplace_lab.evaluation.metrics.regression_metrics`` in original units (``split_test_metrics``).

``--dtype float64`` draws the network in float32 (same weights), casts model and data, and sets
torch's default dtype to float64 before the call, so the function's own hyperparameter tensors
are float64 too (the laplace-torch peer needed float64 on naval-propulsion-plant). A split on which
the authors' code raises gets a row with empty metrics and the error's first line.

    PYTHONPATH=src python experiments/immer2021_uci/peer/marglik_authors_uci.py --repo <aleximmer/marglik checkout> \\
        --data-dir $LAPLACE_LAB_DATA_DIR --sets yacht --splits 0-9
    PYTHONPATH=src python experiments/immer2021_uci/peer/marglik_authors_uci.py --add-ours results/immer2021_uci.jobs.csv

Resumes: (set, split, dtype) already in ``--out`` are skipped. One torch thread.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import sys
import time
from pathlib import Path

from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
METRICS = ("test/la/ll", "test/map/ll", "test/map/rmse", "hparams/sigma_noise")
COLUMNS = ["side", "seed", "commit", "command", "data", "method", "dtype", *METRICS,
           "theirs/prior_precision_mean", "wall_s", "error"]
HEADER = ("# immer2021_uci peer: the paper's code, aleximmer/marglik marglik.py's marglik_optimization\n"
          "# (called unmodified, full GGN, the preset's recipe) on our splits, against our online_full jobs;\n"
          "# seed = split. Written by experiments/immer2021_uci/peer/marglik_authors_uci.py; side 'ours' rows from\n"
          "# results/immer2021_uci.jobs.csv (their commit and command in the row).\n")
RECIPE = {"likelihood": "regression", "prior_structure": "layerwise", "prior_prec_init": 1.0,
          "sigma_noise_init": 1.0, "n_epochs": 1000, "lr": 1e-2, "n_epochs_burnin": 100,
          "marglik_frequency": 50, "n_hypersteps": 50, "lr_hyp": 0.1}


def _reference_helpers():
    """``../laplace_torch_reference.py`` (data, network and evaluation shared with the laplace-torch peer)."""
    spec = importlib.util.spec_from_file_location("laplace_torch_reference", HERE.parent / "laplace_torch_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_of(data: str, split: int, dtype: str) -> str:
    """The command a row stands for (the CSV's ``command``)."""
    return (f"PYTHONPATH=src python experiments/immer2021_uci/peer/marglik_authors_uci.py --repo <aleximmer/marglik> "
            f"--sets {data} --splits {split} --dtype {dtype}")


def run_one(repo: Path, data_dir: str, name: str, split: int, dtype_name: str, recipe: dict | None = None) -> dict:
    """One split through ``marglik_optimization`` of the checkout at ``repo``; the CSV's metric cells."""
    import torch
    from laplace import FullLaplace
    from torch.utils.data import DataLoader, TensorDataset

    ref = _reference_helpers()
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from marglik import marglik_optimization  # the authors' function, unmodified

    dtype = ref.DTYPES[dtype_name]
    dm, X, y = ref.load_split(name, split, 0, data_dir, dtype)
    model = ref.recipe_mlp(X.shape[1], 0, dtype)
    loader = DataLoader(TensorDataset(X, y), batch_size=len(X), shuffle=True)  # full batch
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        start = time.perf_counter()
        la, model, _, _ = marglik_optimization(model, loader, laplace=FullLaplace, **(recipe or RECIPE))
        wall = time.perf_counter() - start
        metrics = ref.split_test_metrics(la, model, dm, dtype)
    finally:
        torch.set_default_dtype(previous)
    return {"test/la/ll": metrics["la_ll"], "test/map/ll": metrics["map_ll"], "test/map/rmse": metrics["rmse"],
            "hparams/sigma_noise": float(la.sigma_noise),
            "theirs/prior_precision_mean": float(la.prior_precision.mean()), "wall_s": round(wall, 1), "error": ""}


def add_ours(out: Path, jobs_csv: Path) -> None:
    """Replace the ``side=ours`` rows of ``out`` by the ``online_full`` jobs of ``jobs_csv`` (seed = split)."""
    sys.path.insert(0, str(ROOT / "src"))
    from laplace_lab.reporting.peer_csv import replace_ours_rows
    from laplace_lab.reporting.peer_ours import ours_rows

    rows = ours_rows(jobs_csv, seed_key="data.split", settings={"data": "data.name", "method": "method_name"},
                     metrics={m: m for m in METRICS}, where={"method_name": "online_full"})
    for row in rows:
        row["dtype"] = "float32"
    kept = replace_ours_rows(out, rows, COLUMNS, extrasaction="ignore")
    print(f"{out}: {len(rows)} ours rows from {jobs_csv}, {kept} theirs rows kept")


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from laplace_lab.data.uci import UCI_DATASETS
    from laplace_lab.reporting.peer_csv import append_row, comma_choices

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="checkout of aleximmer/marglik (the folder holding marglik.py)")
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))
    parser.add_argument("--sets", default=",".join(UCI_DATASETS), help="comma-separated UCI set names")
    parser.add_argument("--splits", default="0-9", help="'0-9' or '0,1,2'")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--out", type=Path, default=HERE / "marglik_authors_uci.csv")
    parser.add_argument("--add-ours", type=Path, metavar="JOBS_CSV",
                        help="immer2021_uci jobs CSV: (re)write its online_full jobs as side=ours rows, then stop")
    args = parser.parse_args()
    if args.add_ours:
        add_ours(args.out, args.add_ours)
        return
    try:
        commit = checkout_commit(args.repo, "aleximmer/marglik", "--repo", needs="marglik.py")
    except PeerCheckoutError as err:
        parser.error(str(err))
    sets = comma_choices(parser, "--sets", args.sets, UCI_DATASETS, "are not UCI sets")
    splits = _reference_helpers().parse_splits(args.splits)
    import torch

    torch.set_num_threads(1)
    done = set()
    if args.out.exists():
        with args.out.open() as f:
            done = {(r["data"], r["seed"], r["dtype"]) for r in csv.DictReader(line for line in f if not line.startswith("#"))
                    if r["side"] == "theirs"}
    else:
        args.out.write_text(HEADER + ",".join(COLUMNS) + "\n")
    for name in sets:
        for split in splits:
            if (name, str(split), args.dtype) in done:
                continue
            try:
                row = run_one(args.repo, args.data_dir, name, split, args.dtype)
            except (torch.linalg.LinAlgError, RuntimeError, ValueError) as error:  # recorded, not hidden
                row = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
                print(f"{name} split {split} ({args.dtype}): the authors' code failed: {row['error']}", flush=True)
            else:
                print(f"{name} split {split} ({args.dtype}): LA ll {row['test/la/ll']:.4f}, plug-in ll "
                      f"{row['test/map/ll']:.4f}, sigma {row['hparams/sigma_noise']:.4f}, {row['wall_s']} s", flush=True)
            row.update(side="theirs", seed=split, commit=commit, command=command_of(name, split, args.dtype), data=name,
                       method="online_full", dtype=args.dtype)
            append_row(args.out, row, COLUMNS, extrasaction="ignore", counted=True)


if __name__ == "__main__":
    main()
