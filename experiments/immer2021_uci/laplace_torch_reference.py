"""Peer reference for the ``immer2021_uci`` table: laplace-torch's ``marglik_training`` (the
authors' library implementation of Immer et al. 2021, Alg. 1) on our UCI splits.

Same data as the preset: ``laplace_lab.data.UCIDataModule`` (the 20 standard splits, inputs and
targets standardised with the split's training statistics, ``val_fraction=0``: all training
rows), same recipe (MLP d-50-1 tanh, Adam lr 1e-2, full batch, 1000 epochs, full GGN, layerwise
prior from 1, sigma from 1, marglik every 50 epochs from epoch 100, 50 hyper steps, lr_hyp 0.1),
and the same test metrics (``laplace_lab.evaluation.metrics.regression_metrics``: mean Gaussian
test log likelihood in original units). laplace-torch is used as a library only.

One row per (set, split) in a CSV; rows already in the file are skipped, so a long run resumes.
``--summary`` prints the mean +- s.e. per set and the reference.yaml entries for them.

    PYTHONPATH=src python experiments/immer2021_uci/laplace_torch_reference.py --sets yacht --splits 0
    PYTHONPATH=src python experiments/immer2021_uci/laplace_torch_reference.py --splits 0-9 --summary
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from laplace_lab.data.uci import UCI_DATASETS, UCIDataModule
from laplace_lab.evaluation.metrics import regression_metrics
from laplace_lab.reporting.peer_csv import append_row, comma_choices

FIELDS = ["data.name", "data.split", "seed", "test_la_ll", "test_map_ll", "test_rmse", "sigma_noise",
          "prior_precision_mean", "wall_s", "dtype", "error"]
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEFAULT_OUT = Path(__file__).with_name("laplace_torch_reference.csv")


def parse_splits(text: str) -> list[int]:
    """``"0-9"`` -> 0..9, ``"0,3,5"`` -> [0, 3, 5]."""
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def load_split(name: str, split: int, seed: int, data_dir: str, dtype: torch.dtype):
    """``(dm, X, y)``: the split as the preset reads it (standardised, all training rows) and its
    training tensors ``[N, D]``, ``[N, 1]`` in ``dtype``."""
    dm = UCIDataModule(name=name, split=split, data_dir=data_dir, val_fraction=0.0, seed=seed, batch_size=1)
    X, y = (t.to(dtype) for t in dm.train_set.tensors)
    return dm, X, y


def recipe_mlp(n_inputs: int, seed: int, dtype: torch.dtype) -> torch.nn.Sequential:
    """The preset's MLP d-50-1 tanh, drawn after ``torch.manual_seed(seed)`` (float32, then cast)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_inputs, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1)).to(dtype)


def split_test_metrics(la, model, dm, dtype: torch.dtype) -> dict[str, float]:
    """Test metrics of a fitted laplace-torch regression Laplace ``la`` and its network, original units:
    ``la_ll`` (GLM predictive + sigma^2), ``map_ll`` (plug-in, sigma^2) and ``rmse`` (plug-in mean)."""
    Xt, yt = (t.to(dtype) for t in dm.test_set.tensors)
    with torch.no_grad():
        f_mu, f_var = la(Xt, pred_type="glm")
        f_mu, f_var = f_mu.reshape(len(Xt), 1), f_var.reshape(len(Xt), 1)
        sigma2 = float(la.sigma_noise) ** 2
        la_metrics = regression_metrics(f_mu, f_var + sigma2, yt, dm.target_mean, dm.target_std)
        map_metrics = regression_metrics(model(Xt), torch.full_like(f_mu, sigma2), yt, dm.target_mean, dm.target_std)
    return {"la_ll": la_metrics["ll"], "map_ll": map_metrics["ll"], "rmse": map_metrics["rmse"]}


def run_one(name: str, split: int, seed: int, data_dir: str, args) -> dict:
    """Train one split with ``marglik_training``; test metrics in original units."""
    from laplace import marglik_training
    from laplace.curvature import BackPackGGN

    dtype = DTYPES[args.dtype]
    dm, X, y = load_split(name, split, seed, data_dir, dtype)
    model = recipe_mlp(X.shape[1], seed, dtype)
    loader = DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=len(X), shuffle=True)  # full batch
    start = time.perf_counter()
    la, model, _, _ = marglik_training(
        model, loader, likelihood="regression", hessian_structure="full", backend=BackPackGGN,
        optimizer_kwargs={"lr": args.lr}, n_epochs=args.epochs, lr_hyp=args.lr_hyp, prior_structure="layerwise",
        n_epochs_burnin=args.burnin, n_hypersteps=args.hyper_steps, marglik_frequency=args.frequency,
        prior_prec_init=1.0, sigma_noise_init=1.0,
    )
    wall = time.perf_counter() - start
    metrics = split_test_metrics(la, model, dm, dtype)
    return {"data.name": name, "data.split": split, "seed": seed, "test_la_ll": metrics["la_ll"],
            "test_map_ll": metrics["map_ll"], "test_rmse": metrics["rmse"], "sigma_noise": float(la.sigma_noise),
            "prior_precision_mean": float(la.prior_precision.mean()), "wall_s": wall, "dtype": args.dtype,
            "error": ""}


def failed_row(name: str, split: int, seed: int, args, error: Exception) -> dict:
    """A row for a split on which laplace-torch raised: metrics nan, the error's first line kept."""
    nan = float("nan")
    return {"data.name": name, "data.split": split, "seed": seed, "test_la_ll": nan, "test_map_ll": nan,
            "test_rmse": nan, "sigma_noise": nan, "prior_precision_mean": nan, "wall_s": nan, "dtype": args.dtype,
            "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}


def read_rows(path: Path) -> list[dict]:
    """Rows of the CSV; a file written before a column was added is rewritten with the new header
    (``dtype`` of such rows: float32, the only dtype the script had)."""
    if not path.exists():
        return []
    with path.open() as f:
        reader = csv.DictReader(f)
        rows, header = list(reader), reader.fieldnames
    if header != FIELDS:
        for r in rows:
            r.setdefault("dtype", "float32")
            r.setdefault("error", "")
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows({k: r.get(k, "") for k in FIELDS} for r in rows)
    return rows


def summary(rows: list[dict]) -> str:
    """Mean +- s.e. of the Laplace test LL per set and dtype (failed splits counted apart), and
    reference.yaml entries (tolerance: 2 s.e.; ids of float64 runs end in ``_float64``)."""
    lines, entries = ["set | dtype | n | failed | test LL (laplace-torch) mean +- s.e."], []
    for name, dtype in itertools.product(UCI_DATASETS, DTYPES):
        picked = [r for r in rows if r["data.name"] == name and r.get("dtype", "float32") == dtype]
        vals = [float(r["test_la_ll"]) for r in picked if not r.get("error")]
        failed = len(picked) - len(vals)
        if not vals:
            if failed:
                lines.append(f"{name} | {dtype} | 0 | {failed} | -")
            continue
        mean = sum(vals) / len(vals)
        se = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) / len(vals)) if len(vals) > 1 else float("nan")
        lines.append(f"{name} | {dtype} | {len(vals)} | {failed} | {mean:.3f} +- {se:.3f}")
        suffix = "" if dtype == "float32" else f"_{dtype}"
        entries.append(
            f"  - id: peer_laplace_torch_{name.replace('-', '_')}{suffix}\n    kind: value\n"
            f"    row: {{data.name: {name}, method_name: online_full}}\n    metric: test/la/ll\n"
            f"    value: {mean:.4f}\n    tolerance: {2 * se if se == se else 0.1:.4f}   # 2 s.e. over {len(vals)} splits\n"
            f"    source: \"laplace-torch marglik_training ({dtype}) on our splits, "
            f"experiments/immer2021_uci/laplace_torch_reference.py\"")
    return "\n".join(lines) + "\n\nreference.yaml entries:\n" + "\n".join(entries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(UCI_DATASETS), help="comma-separated UCI set names")
    parser.add_argument("--splits", default="0-9", help="'0-9' or '0,1,2'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--lr-hyp", type=float, default=0.1)
    parser.add_argument("--burnin", type=int, default=100)
    parser.add_argument("--frequency", type=int, default=50)
    parser.add_argument("--hyper-steps", type=int, default=50)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES),
                        help="dtype of the model and data (the recipe: float32)")
    parser.add_argument("--summary", action="store_true", help="print per-set means and reference.yaml entries")
    args = parser.parse_args()
    sets = comma_choices(parser, "--sets", args.sets, UCI_DATASETS, "are not UCI sets")
    torch.set_num_threads(1)
    rows = read_rows(args.out)
    done = {(r["data.name"], int(r["data.split"]), int(r["seed"]), r.get("dtype", "float32")) for r in rows}
    for name in sets:
        for split in parse_splits(args.splits):
            if (name, split, args.seed, args.dtype) in done:
                continue
            try:
                row = run_one(name, split, args.seed, args.data_dir, args)
            except (torch.linalg.LinAlgError, RuntimeError, ValueError) as error:  # recorded, not hidden
                row = failed_row(name, split, args.seed, args, error)
                print(f"{name} split {split}: laplace-torch failed: {row['error']}", flush=True)
            else:
                print(f"{name} split {split}: test LL {row['test_la_ll']:.3f} (MAP {row['test_map_ll']:.3f}), "
                      f"sigma {row['sigma_noise']:.3f}, {row['wall_s']:.0f} s", flush=True)
            append_row(args.out, row, FIELDS)
            rows.append({k: str(v) for k, v in row.items()})
    if args.summary:
        print(summary(rows))


if __name__ == "__main__":
    main()
