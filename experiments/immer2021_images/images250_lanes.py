"""The 250-epoch ``immer2021_images`` sweep on a CPU: its 48 jobs in two one-thread lanes.

    python experiments/immer2021_images/images250_lanes.py --checkout <checkout of the sweep's commit> \\
        --output-root outputs/images250 [--data mnist|fashion_mnist] [--print]

One lane per data set (``--data``: only that one), each running its jobs one after another as
``python -m laplace_lab.train <overrides> paths.output_root=<root>`` from ``--checkout`` (its
``src/`` first on the path, so every job records that checkout's commit) with one torch / OpenMP
thread. Per set, the order is: online marglik seed by seed (LeNet, MLP 500-300, MLP 100-100,
MLP 50: the preset's two architectures and the two smaller model-selection candidates), then
``map_wd``, then ``map_grid`` (MLP 500-300 and LeNet, seeds 0-2). Finished jobs are skipped in
seconds and cut-off ones resume from their last epoch (the preset's checkpointing), so the same
command continues a sweep. Logs: ``<root>/lanes/<data>.<i>.log``. ``--print``: the commands only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

DATA = ("mnist", "fashion_mnist")
SEEDS = (0, 1, 2)
ONLINE_MODELS = ("model=lenet", "model=mlp_500_300", "model=mlp model.widths=[100,100]", "model=mlp model.widths=[50]")
BASELINE_MODELS = ("model=lenet", "model=mlp_500_300")
BASELINES = ("map_wd", "map_grid")


def lane_jobs(data: str) -> list[list[str]]:
    """The overrides of each job of ``data``'s lane, in the order it runs them."""
    if data not in DATA:
        raise ValueError(f"--data={data!r} is not supported; allowed: {list(DATA)}")
    head = ["experiment=immer2021_images", f"data={data}"]
    jobs = [[*head, *model.split(), "method=online_kron", f"seed={seed}"] for seed in SEEDS for model in ONLINE_MODELS]
    jobs += [[*head, model, f"method={method}", f"seed={seed}"]
             for method in BASELINES for seed in SEEDS for model in BASELINE_MODELS]
    return jobs


def job_command(overrides: list[str], root: Path, python: str = sys.executable) -> list[str]:
    """The command line of one job, its outputs under ``root``."""
    return [python, "-m", "laplace_lab.train", *overrides, f"paths.output_root={root}"]


def run_lane(data: str, checkout: Path, root: Path) -> None:
    logs = root / "lanes"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(checkout / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for i, overrides in enumerate(lane_jobs(data), 1):
        cmd = job_command(overrides, root)
        with open(logs / f"{data}.lane", "a") as lane_log:
            lane_log.write(f"{time.strftime('%FT%T%z')} start {i} {shlex.join(cmd[1:])}\n")
        with open(logs / f"{data}.{i}.log", "w") as out:
            rc = subprocess.run(cmd, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        with open(logs / f"{data}.lane", "a") as lane_log:
            lane_log.write(f"{time.strftime('%FT%T%z')} end {i} rc={rc}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help="a clean checkout of the sweep's commit")
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--data", choices=DATA, action="append", help="only this set's lane (repeatable)")
    p.add_argument("--print", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    checkout, root = args.checkout.resolve(), args.output_root.resolve()
    if not (checkout / "experiments" / "immer2021_images" / "preset.yaml").is_file():
        p.error(f"--checkout {checkout} has no experiments/immer2021_images/preset.yaml")
    sets = args.data or list(DATA)
    if args.print:
        for data in sets:
            for overrides in lane_jobs(data):
                print(shlex.join(job_command(overrides, root, python="python")))
        return 0
    lanes = [threading.Thread(target=run_lane, args=(data, checkout, root)) for data in sets]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
