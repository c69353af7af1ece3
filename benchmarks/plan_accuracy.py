"""Benchmark: the memory and time plan (``laplace.plan``) against measured fits on this machine.

For every case (model, subset, structure, batch) one subprocess (``--threads`` torch threads,
float32, random inputs and labels: a fit's memory and time do not depend on their values): a
warm-up fit on two inputs (loads the kernels), then the planned fit peak (``plan.laplace_plan``)
and the measured one: the process's peak RSS during ``la.fit`` above the RSS before it (``VmHWM``
reset through ``/proc/self/clear_refs``, as ``benchmarks/fit_memory.py``; glibc's mmap threshold
fixed, ``ENV``, so that the RSS follows the live tensors), CUDA
``max_memory_allocated`` above the allocation before; then the fit's wall time against the time
``plan.probe_fit_time`` predicts from one batch (fitted twice, the second timed, times the number
of batches, plus the measured ``fit_end``, times ``plan.FIT_TIME_OVERHEAD``), probed after the
measured fit. Prints one markdown row per case with the ratios predicted / measured and whether
memory is within 30% and time within a factor 2.

    python benchmarks/plan_accuracy.py [--threads 1] [--device cpu] [--cases all|NAME,NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402  (benchmarks/gpu.py: models, meter, src/ on the path)

# glibc's mmap threshold fixed at its default (128 KiB): freed large tensors leave the RSS, so the peak
# RSS measures live tensors (the threshold otherwise grows with every freed block, and whether a
# batch's freed memory is kept in the heap then varies run to run: 67-100 MiB for one case)
ENV = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072"}
# name: (model, input shape, classes, subset, structure, batch, inputs)
CASES = {
    "mlp1000-kron-all-b256": ("mlp1000", (784,), 10, "all", "kron", 256, 2048),
    "mlp1000-kron-all-b1024": ("mlp1000", (784,), 10, "all", "kron", 1024, 4096),
    "mlp1000-diag-all-b256": ("mlp1000", (784,), 10, "all", "diag", 256, 2048),
    "mlp1000-diag-all-b1024": ("mlp1000", (784,), 10, "all", "diag", 1024, 4096),
    "mlp100-full-all-b128": ("mlp100", (100,), 10, "all", "full", 128, 1024),
    "mlp300-full-last-b256": ("mlp300", (784,), 10, "last_layer", "full", 256, 2048),
    "mlp1000c1000-kron-last-b64": ("mlp1000", (784,), 1000, "last_layer", "kron", 64, 512),
    "lenet-kron-all-b128": ("lenet", (1, 28, 28), 10, "all", "kron", 128, 1024),
    "lenet-diag-all-b128": ("lenet", (1, 28, 28), 10, "all", "diag", 128, 1024),
    "wrn-kron-all-b32": ("wrn", (3, 32, 32), 10, "all", "kron", 32, 64),
}


def build_model(name: str, shape, classes: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "lenet":
        return gpu.LeNet(shape, classes)
    if name == "wrn":
        return gpu.WideResNet(shape, classes, depth=16, widen_factor=4, norm="none")
    width = {"mlp1000": [1000, 1000], "mlp300": [300], "mlp100": [40]}[name]
    dims = [shape[0], *width]
    layers = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(dims[-1], classes))


def worker(args) -> dict:
    import torch

    from laplace_lab.laplace import Laplace, plan

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model_name, shape, classes, subset, structure, batch, n = CASES[args.case]
    model = build_model(model_name, shape, classes).to(device)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, *shape, generator=g).to(device)
    y = torch.randint(0, classes, (n,), generator=g).to(device)

    def make():
        return Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure,
                       memory_budget=None)

    make().fit([(X[:2], y[:2])])  # warm-up: kernels and their workspaces loaded
    la = make()
    predicted = plan.laplace_plan(la, X[:batch])[0]
    loader = gpu.DeviceBatches(X, y, batch)
    meter = gpu.Meter(device)
    gpu.cleanup(device)
    base = meter.start()
    start = time.perf_counter()
    la.fit(loader)
    meter.sync()
    seconds = time.perf_counter() - start
    measured = meter.peak() - base
    del la
    gpu.cleanup(device)
    predicted_s = plan.probe_fit_time(make, X[:batch], y[:batch], len(loader))
    return {"case": args.case, "n_params": sum(p.numel() for p in make().params), "batch": batch,
            "batches": len(loader), "planned_mib": predicted.fit / 2**20, "measured_mib": measured / 2**20,
            "planned_s": predicted_s, "measured_s": seconds,
            "largest_part": max(predicted.parts, key=predicted.parts.get)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cases", default="all", help=f"comma-separated names of {list(CASES)}, or all")
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print(json.dumps(worker(args)))
        return
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        p.error(f"--cases {unknown} unknown; allowed: {list(CASES)} or all")
    rows = []
    for name in names:
        cmd = [sys.executable, __file__, "--case", name, "--threads", str(args.threads), "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=ENV)
        if out.returncode:
            print(f"{name}: FAILED {out.stderr.strip().splitlines()[-1][:300]}", flush=True)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nPlanned vs measured fit (laplace.plan), {args.device}, {args.threads} thread(s), float32, random data")
    print("| case | parameters | batches | planned MiB | measured MiB | mem ratio | planned s | measured s | "
          "time ratio | largest planned part | mem within 30% | time within 2x |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mem, tim = r["planned_mib"] / r["measured_mib"], r["planned_s"] / r["measured_s"]
        print(f"| {r['case']} | {r['n_params']:,} | {r['batches']} | {r['planned_mib']:.1f} | {r['measured_mib']:.1f} | "
              f"{mem:.2f} | {r['planned_s']:.2f} | {r['measured_s']:.2f} | {tim:.2f} | {r['largest_part']} | "
              f"{'yes' if abs(mem - 1) <= 0.3 else 'NO'} | {'yes' if 0.5 <= tim <= 2 else 'NO'} |")


if __name__ == "__main__":
    main()
