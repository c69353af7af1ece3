"""Benchmark: peak memory of the GLM probit predictive ``la(X)`` with default arguments against the
number of test images (all-weights KFAC LeNet-5, MNIST), so that anything scaling with ``N`` shows.

For each ``N`` in ``--sizes`` one subprocess (``--threads`` torch threads, float32): LeNet-5 trained
one epoch (Adam 1e-3, batch 128) on the first ``--n-train`` MNIST training images, KFAC-GGN fitted on
them, then ``la(X_test[:N])``. Reported: the process's peak RSS (``ru_maxrss``, everything included:
torch, data, training, fit, predictive), the peak during the predictive above the RSS before it
(``VmHWM`` reset through ``/proc/self/clear_refs``), and the output's size. ``--device cuda``:
``max_memory_allocated`` during the predictive above the allocation before it.

    LAPLACE_LAB_DATA_DIR=/path/to/data python benchmarks/predict_memory.py [--sizes 2000,10000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402  (benchmarks/gpu.py: MNIST reader, meter, src/ on the path)


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    X, y, source = gpu.mnist(args.data_dir, True, args.n_train, device)
    Xt, _, _ = gpu.mnist(args.data_dir, False, args.n, device)
    torch.manual_seed(0)
    model = gpu.train_epoch(gpu.LeNet((1, 28, 28), 10).to(device), gpu.DeviceBatches(X, y, 128, shuffle=True)).eval()
    la = gpu.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    la.fit(gpu.DeviceBatches(X, y, 128))
    meter = gpu.Meter(device)
    base = meter.start()
    start = time.perf_counter()
    probs = la(Xt)
    meter.sync()
    seconds = time.perf_counter() - start
    peak = meter.peak()
    return {"n": args.n, "source": source, "seconds": seconds, "above_gib": (peak - base) / 2**30,
            "process_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "output_mib": probs.numel() * probs.element_size() / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2000,10000")
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR"))
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.n:
        print(json.dumps(worker(args)))
        return
    rows = []
    for n in [int(v) for v in args.sizes.split(",")]:
        cmd = [sys.executable, __file__, "--n", str(n), "--n-train", str(args.n_train), "--threads",
               str(args.threads), "--device", args.device] + (["--data-dir", args.data_dir] if args.data_dir else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"N={n}: failed: {out.stderr.strip().splitlines()[-1]}", flush=True)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nGLM probit la(X), default arguments, all-weights KFAC LeNet-5 ({rows[0]['source'] if rows else '?'}), "
          f"{args.device}, {args.threads} thread(s)")
    print("| test images | predictive s | peak above start GiB | process peak GiB | output MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['seconds']:.1f} | {r['above_gib']:.3f} | {r['process_peak_gib']:.2f} | {r['output_mib']:.2f} |")


if __name__ == "__main__":
    main()
