"""Whole-process wall time of small online-marglik runs: ours against laplace-torch (the target:
a fraction of the peer's time).

For each set (UCI split 0 with all training rows, or the sinusoid) and each repeat, two
processes run back to back with the same recipe (Immer et al. 2021 UCI: MLP 50 tanh, Adam 1e-2,
one full batch, 1000 epochs, marglik every 50 epochs from epoch 100, 50 hyper steps, full GGN,
layerwise prior, noise std by marglik; the MAP loss on laplace-torch's scale, ``map_loss_scale=mse``):

- ours: ``python -m laplace_lab.train data=... method=online_full ...`` (``OURS_RECIPE``);
- peer: ``python benchmarks/e2e_peer.py`` (laplace-torch's ``marglik_training``) on the same
  standardised split, exported here to a ``.pt`` file before the timing.

Each time is the wall time of the whole process (interpreter start, imports, data, training,
evaluation), and beside it the process's CPU time (user + system, from ``wait4``), which a load
on the machine inflates far less than the wall time. Printed per set: the medians over repeats,
their ratios (ours / peer) and both test log likelihoods (original units). Also times the default experiment (``make run``:
``python -m laplace_lab.train`` with no overrides). Data from ``LAPLACE_LAB_DATA_DIR`` (else
the repository's ``data/``).

    python benchmarks/e2e_small.py [--sets yacht,energy,boston-housing,concrete,sinusoid]
        [--repeats 3] [--threads 2] [--epochs 1000] [--skip-default] [--skip-peer]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
               "marglik.burnin=100", "map_loss_scale=mse", "evaluation=regression", "logger=csv")


def data_overrides(name: str) -> list[str]:
    if name == "sinusoid":
        return ["data=sinusoid", "data.n_val=0"]
    return ["data=uci", f"data.name={name}", "data.split=0", "data.val_fraction=0"]


def export_split(name: str, data_dir: str, path: Path) -> None:
    """The standardised train/test tensors our data module builds, for the peer."""
    if str(ROOT / "src") not in sys.path:  # this checkout's data modules, as in the timed processes
        sys.path.insert(0, str(ROOT / "src"))
    from laplace_lab.data import SinusoidDataModule, UCIDataModule

    if name == "sinusoid":
        dm = SinusoidDataModule(n_val=0, seed=0)
    else:
        dm = UCIDataModule(name=name, split=0, data_dir=data_dir, val_fraction=0.0, seed=0)
    (x, y), (xt, yt) = dm.train_set.tensors, dm.test_set.tensors
    torch.save({"x_train": x, "y_train": y, "x_test": xt, "y_test": yt,
                "target_std": float(dm.target_std.reshape(-1)[0])}, path)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one process (run alone: the children's CPU delta)."""
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, cpu, proc.stdout


def run_ours(overrides: list[str], env: dict, workdir: Path) -> tuple[float, float, float | None]:
    """(wall s, CPU s, test/la/ll or None) of one ``laplace_lab.train`` process."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    wall, cpu, _ = timed([sys.executable, "-m", "laplace_lab.train", *overrides, f"hydra.run.dir={run_dir}"], env)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return wall, cpu, metrics.get("test/la/ll")


def run_peer(split: Path, epochs: int, env: dict) -> tuple[float, float, float]:
    wall, cpu, out = timed([sys.executable, str(ROOT / "benchmarks" / "e2e_peer.py"), str(split),
                            f"--epochs={epochs}"], env)
    return wall, cpu, json.loads(out.strip().splitlines()[-1])["test_ll"]


def medians(rows: list[tuple[float | None, ...]]) -> list[float | None]:
    """Column medians; None for a column with a missing value (the default run has no test LL)."""
    return [None if None in column else statistics.median(column) for column in zip(*rows)]


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
    print("| set | ours wall [s] | peer wall [s] | wall ours / peer | ours CPU [s] | peer CPU [s] | "
          "CPU ours / peer | ours test LL | peer test LL |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
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
            w, c, ll = medians(ours)
            if peer:
                pw, pc, pll = medians(peer)
                print(f"| {name} | {w:.2f} | {pw:.2f} | {w / pw:.2f} | {c:.2f} | {pc:.2f} | {c / pc:.2f} | "
                      f"{ll:.3f} | {pll:.3f} |", flush=True)
            else:
                print(f"| {name} | {w:.2f} | - | - | {c:.2f} | - | - | {ll:.3f} | - |", flush=True)
        if not args.skip_default:
            runs = [run_ours([], env, workdir) for _ in range(args.repeats)]
            w, c, _ = medians(runs)
            print(f"\ndefault experiment (`make run`, no overrides): median wall {w:.2f} s, CPU {c:.2f} s over "
                  f"{args.repeats} (walls: {', '.join(f'{r[0]:.2f}' for r in runs)})", flush=True)


if __name__ == "__main__":
    main()
