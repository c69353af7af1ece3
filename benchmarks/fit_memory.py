"""Benchmark: peak memory and time of the all-weights KFAC-GGN fit of WRN-16-4 without normalisation
(``model=wrn16_4_nonorm``, 2.7M parameters), ours beside laplace-torch (curvlinops backend, its default).

Each (implementation, repeat) runs in its own subprocess: peak memory is that process's peak RSS
during the fit minus its RSS before it (``VmHWM`` reset through ``/proc/self/clear_refs``), on CUDA
``max_memory_allocated`` minus the allocation before; time is the fit's wall clock (CUDA:
synchronised) and, on the CPU, also the process CPU time. Random CIFAR-shaped images (the fit's cost
does not depend on their values), batch ``--batch-size``. Prints one markdown row per
implementation (medians over ``--repeats``, implementations interleaved) and the ratios to the peer.

    python benchmarks/fit_memory.py [--images 256] [--batch-size 32] [--repeats 3] [--device cpu]
        [--threads 1] [--peers curvlinops]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402  (benchmarks/gpu.py: data, meter, src/ on the path)


def worker(args) -> dict:
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = gpu.WideResNet((3, 32, 32), 10, depth=16, widen_factor=4, norm="none").to(device)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(args.images, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (args.images,), generator=g).to(device)
    loader = gpu.DeviceBatches(X, y, args.batch_size)
    if args.impl == "ours":
        la = gpu.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    else:
        la = gpu.peer_laplace(model, "all", args.impl)
    meter = gpu.Meter(device)
    base = meter.start()
    wall, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        la.fit(loader)
    meter.sync()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = meter.peak()
    lml = float(la.log_marginal_likelihood())
    return {"impl": args.impl, "wall_s": wall, "cpu_s": cpu, "peak_gib": peak / 2**30,
            "above_gib": (peak - base) / 2**30, "log_marglik": lml}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--peers", default="curvlinops", help="laplace-torch backends: curvlinops,backpack or none")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.impl:
        print(json.dumps(worker(args)))
        return
    impls = ["ours", *(x for x in args.peers.split(",") if x and x != "none")]
    res: dict[str, list] = {i: [] for i in impls}
    base = [sys.executable, __file__, "--images", str(args.images), "--batch-size", str(args.batch_size),
            "--device", args.device, "--threads", str(args.threads)]
    for rep in range(args.repeats):
        for impl in impls:
            try:
                out = subprocess.run(base + ["--impl", impl], capture_output=True, text=True, timeout=args.timeout)
                if out.returncode:
                    raise RuntimeError(out.stderr.strip().splitlines()[-1][:200])
                r = json.loads(out.stdout.strip().splitlines()[-1])
            except Exception as err:  # a peer failing is reported, not fatal
                print(f"{impl} repeat {rep + 1}: FAILED {type(err).__name__}: {err}", flush=True)
                continue
            res[impl].append(r)
            print(json.dumps(r), flush=True)
    med = statistics.median
    print(f"\nWRN-16-4 no norm, all-weights KFAC-GGN fit, {args.images} random images, batch {args.batch_size}, "
          f"{args.device}, {args.threads} thread(s), medians of {args.repeats}")
    print("| impl | wall s | CPU s | peak above start GiB | process peak GiB | log marglik | memory / peer | CPU time / peer |")
    print("|---|---|---|---|---|---|---|---|")
    peer = next((res[i] for i in impls[1:] if res[i]), None)
    for impl in impls:
        rs = res[impl]
        if not rs:
            print(f"| {impl} | failed | | | | | | |")
            continue
        above, cpu = med(r["above_gib"] for r in rs), med(r["cpu_s"] for r in rs)
        ratio_m = f"{above / med(r['above_gib'] for r in peer):.2f}" if peer else "-"
        ratio_t = f"{cpu / med(r['cpu_s'] for r in peer):.2f}" if peer else "-"
        print(f"| {impl} | {med(r['wall_s'] for r in rs):.2f} | {cpu:.2f} | {above:.3f} | "
              f"{med(r['peak_gib'] for r in rs):.3f} | {rs[-1]['log_marglik']:.2f} | {ratio_m} | {ratio_t} |")


if __name__ == "__main__":
    main()
