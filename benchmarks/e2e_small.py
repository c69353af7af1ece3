"""Whole-process wall time of small online-marglik runs: ours against laplace-torch (issue 16).

For each set (UCI split 0 with all training rows, or the sinusoid) and each repeat, two
processes run back to back with the same recipe (Immer et al. 2021 UCI: MLP 50 tanh, Adam 1e-2,
one full batch, 1000 epochs, marglik every 50 epochs from epoch 100, 50 hyper steps, full GGN,
layerwise prior, noise std by marglik):

- ours: ``python -m laplace_lab.train data=... method=online_full ...`` (``OURS_RECIPE``);
- peer: ``python benchmarks/e2e_peer.py`` (laplace-torch's ``marglik_training``) on the same
  standardised split, exported here to a ``.pt`` file before the timing.

Each time is the wall time of the whole process (interpreter start, imports, data, training,
evaluation). Printed per set: the medians over repeats, their ratio (ours / peer) and both
test log likelihoods (original units). Also times the default experiment (``make run``:
``python -m laplace_lab.train`` with no overrides). Data from ``LAPLACE_LAB_DATA_DIR`` (else
the repository's ``data/``).

    python benchmarks/e2e_small.py [--sets yacht,energy,boston-housing,concrete,sinusoid]
        [--repeats 3] [--threads 2] [--epochs 1000] [--skip-default] [--skip-peer]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
UCI_SETS = ("yacht", "energy", "boston-housing", "concrete")
SETS = (*UCI_SETS, "sinusoid")
OURS_RECIPE = ("data.batch_size=100000", "model=mlp", "model.widths=[50]", "model.activation=tanh",
               "method=online_full", "optimizer.lr=1e-2", "marglik.frequency=50", "marglik.n_steps=50",
               "marglik.burnin=100", "evaluation=regression", "logger=csv")


def data_overrides(name: str) -> list[str]:
    if name == "sinusoid":
        return ["data=sinusoid", "data.n_val=0"]
    return ["data=uci", f"data.name={name}", "data.split=0", "data.val_fraction=0"]


def export_split(name: str, data_dir: str, path: Path) -> None:
    """The standardised train/test tensors our data module builds, for the peer."""
    from laplace_lab.data import SinusoidDataModule, UCIDataModule

    if name == "sinusoid":
        dm = SinusoidDataModule(n_val=0, seed=0)
    else:
        dm = UCIDataModule(name=name, split=0, data_dir=data_dir, val_fraction=0.0, seed=0)
    (x, y), (xt, yt) = dm.train_set.tensors, dm.test_set.tensors
    torch.save({"x_train": x, "y_train": y, "x_test": xt, "y_test": yt,
                "target_std": float(dm.target_std.reshape(-1)[0])}, path)


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def run_ours(overrides: list[str], env: dict, workdir: Path) -> tuple[float, float | None]:
    """(wall seconds, test/la/ll or None) of one ``laplace_lab.train`` process."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    wall, _ = timed([sys.executable, "-m", "laplace_lab.train", *overrides, f"hydra.run.dir={run_dir}"], env)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return wall, metrics.get("test/la/ll")


def run_peer(split: Path, epochs: int, env: dict) -> tuple[float, float]:
    wall, out = timed([sys.executable, str(ROOT / "benchmarks" / "e2e_peer.py"), str(split),
                       f"--epochs={epochs}"], env)
    return wall, json.loads(out.strip().splitlines()[-1])["test_ll"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"subset of {','.join(SETS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both processes")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--skip-default", action="store_true", help="do not time the default experiment")
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    sets = [s for s in args.sets.split(",") if s]
    bad = [s for s in sets if s not in SETS]
    if bad or args.repeats < 1 or args.threads < 1:
        parser.error(f"--sets from {list(SETS)} (got unknown {bad}); --repeats >= 1; --threads >= 1")

    data_dir = os.environ.get("LAPLACE_LAB_DATA_DIR", str(ROOT / "data"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "LAPLACE_LAB_DATA_DIR": data_dir, "WANDB_SILENT": "true",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    print(f"threads={args.threads} repeats={args.repeats} epochs={args.epochs} data={data_dir}", flush=True)
    print("| set | ours [s] | laplace-torch [s] | ours / peer | ours test LL | peer test LL |")
    print("|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in sets:
            split = workdir / f"{name}.pt"
            export_split(name, data_dir, split)
            overrides = [*data_overrides(name), *OURS_RECIPE, f"trainer.max_epochs={args.epochs}"]
            ours, peer = [], []
            for _ in range(args.repeats):  # interleaved: a load change hits both sides
                ours.append(run_ours(overrides, env, workdir))
                if not args.skip_peer:
                    peer.append(run_peer(split, args.epochs, env))
            t_ours, ll_ours = statistics.median(w for w, _ in ours), statistics.median(ll for _, ll in ours)
            if peer:
                t_peer, ll_peer = statistics.median(w for w, _ in peer), statistics.median(ll for _, ll in peer)
                print(f"| {name} | {t_ours:.2f} | {t_peer:.2f} | {t_ours / t_peer:.2f} | {ll_ours:.3f} | "
                      f"{ll_peer:.3f} |", flush=True)
            else:
                print(f"| {name} | {t_ours:.2f} | - | - | {ll_ours:.3f} | - |", flush=True)
        if not args.skip_default:
            walls = [run_ours([], env, workdir)[0] for _ in range(args.repeats)]
            print(f"\ndefault experiment (`make run`, no overrides): median {statistics.median(walls):.2f} s "
                  f"over {args.repeats} (all: {', '.join(f'{w:.2f}' for w in walls)})", flush=True)


if __name__ == "__main__":
    main()
