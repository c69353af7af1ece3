"""Benchmark: one online-marglik step (all-weights KFAC-GGN fit on the training data + ``K`` hyper
steps on a layerwise prior) against a bare training epoch, for one or more source trees run in
alternating subprocesses, so that code versions are compared under the same load.

Each subprocess (``--threads`` torch threads, ``--device``): LeNet-5 (seed 0) on the first
``--n-train`` MNIST training images, batch 128; times (process CPU time on the CPU, synchronised
wall clock on CUDA) of one Adam training epoch, of ``Laplace.fit`` and of
``MarglikOptimizer.run(la, K)`` (whichever loop the tree has). Reported per tree: medians over
``--repeats`` of each and of ``(epoch + fit + hyper steps) / epoch``, the marglik epoch in units of
a bare epoch (the issue's ratio without Lightning's overhead in the unit).

    LAPLACE_LAB_DATA_DIR=/path/to/data python benchmarks/marglik_step.py --src src,/path/to/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(args) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    import gpu

    from laplace_lab.laplace.hyper import MarglikOptimizer

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    X, y, source = gpu.mnist(args.data_dir, True, args.n_train, device)
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    meter = gpu.Meter(device)

    def timed(fn):
        meter.sync()
        start = clock()
        out = fn()
        meter.sync()
        return clock() - start, out

    torch.manual_seed(0)
    model = gpu.LeNet((1, 28, 28), 10).to(device)
    epoch, _ = timed(lambda: gpu.train_epoch(model, gpu.DeviceBatches(X, y, 128, shuffle=True)))
    la = gpu.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                     prior_structure="layerwise", prior_precision=torch.ones(10, device=device))
    fit, _ = timed(lambda: la.fit(gpu.DeviceBatches(X, y, 128)))
    hyper = MarglikOptimizer(la.prior_precision.detach().log(), lr=0.1)
    steps, counts = timed(lambda: hyper.run(la, args.n_steps))
    return {"src": args.src, "source": source, "epoch_s": epoch, "fit_s": fit, "hyper_s": steps,
            "accepted": counts[0], "log_prior": hyper.log_prior.detach().cpu().tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", default="src", help="comma-separated source trees (each holds laplace_lab/)")
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--n-steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    srcs = [s for s in args.src.split(",") if s]
    res: dict[str, list] = {s: [] for s in srcs}
    for _ in range(args.repeats):
        for src in srcs:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            cmd = [sys.executable, __file__, "--worker", "--src", src, "--n-train", str(args.n_train), "--n-steps",
                   str(args.n_steps), "--threads", str(args.threads), "--device", args.device]
            cmd += ["--data-dir", args.data_dir] if args.data_dir else []
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                print(f"{src}: failed: {out.stderr.strip().splitlines()[-1]}", flush=True)
                continue
            res[src].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(res[src][-1]), flush=True)
    med = statistics.median
    clock = "CPU" if args.device == "cpu" else "wall"
    print(f"\nLeNet-5, {args.n_train} MNIST images, batch 128, all-weights KFAC-GGN, layerwise prior, "
          f"K={args.n_steps}, {args.device}, {args.threads} thread(s), {clock} seconds, medians of {args.repeats}")
    print("| source tree | epoch s | fit s | K hyper steps s | fit / epoch | marglik epoch / bare epoch |")
    print("|---|---|---|---|---|---|")
    for src, rs in res.items():
        if not rs:
            continue
        print(f"| {src} | {med(r['epoch_s'] for r in rs):.2f} | {med(r['fit_s'] for r in rs):.2f} | "
              f"{med(r['hyper_s'] for r in rs):.3f} | {med(r['fit_s'] / r['epoch_s'] for r in rs):.2f} | "
              f"{med((r['epoch_s'] + r['fit_s'] + r['hyper_s']) / r['epoch_s'] for r in rs):.2f} |")


if __name__ == "__main__":
    main()
