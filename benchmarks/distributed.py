"""Benchmark: the Laplace fit across processes (``laplace.distributed``), 1 vs 2 gloo processes on
the CPU, one thread each.

Workload: LeNet-5 (61.7k parameters) on ``--images`` random MNIST-shaped images (the fit's cost does
not depend on their values), batch ``--batch-size``, float32; structures kron and diag on all
weights, full on the last layer. Per (structure, world size, repeat) one launch of ``world``
processes (``--worker``; file:// rendezvous, group timeout 120 s); each rank fits its
``DistributedSampler`` shard and times, after a barrier:

- ``fit``: ``la.fit(shard)``, including the agreement check and the all-reduce of the accumulators
  (``reduce``: the time inside ``distributed.reduce_fit`` alone);
- ``marglik``: one evaluation of the log marginal likelihood and its gradient in the log prior
  precision (layerwise prior), as one online-marglik hyper step takes it.

Peak memory per rank: the process's peak RSS over the fit (``VmHWM``, reset through
``/proc/self/clear_refs`` before it) and that peak minus the RSS before. Scaling efficiency
``T_1 / (2 T_2)`` with ``T_2`` the slower rank (medians over ``--repeats``, runs interleaved), in
wall clock and in the fit's process CPU time (the busiest rank's; on a shared machine the CPU time
still shows how the work splits when the wall clock does not).
Accuracy: the largest absolute difference of the log marglik and of the GLM probit predictive on
256 test images between each 2-process rank and the 1-process fit.

    python benchmarks/distributed.py [--images 2048] [--batch-size 128] [--repeats 3] [--out dist.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STRUCTURES = (("kron", "all"), ("diag", "all"), ("full", "last_layer"))


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu  # benchmarks/gpu.py: Meter, and src/ on the path

    from laplace_lab.laplace import Laplace, distributed
    from laplace_lab.models import LeNet

    if args.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    g = torch.Generator().manual_seed(0)
    X, y = torch.rand(args.images, 1, 28, 28, generator=g), torch.randint(0, 10, (args.images,), generator=g)
    X_test = torch.rand(256, 1, 28, 28, generator=g)
    ds = torch.utils.data.TensorDataset(X, y)
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=args.world, rank=args.rank, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler)
    la = Laplace(model, "classification", subset_of_weights=args.subset, hessian_structure=args.structure,
                 prior_precision=1.0, prior_structure="layerwise")
    reduce_s = [0.0]
    inner = distributed.reduce_fit

    def timed_reduce(la_, group):
        t = time.perf_counter()
        inner(la_, group)
        reduce_s[0] += time.perf_counter() - t

    distributed.reduce_fit = timed_reduce
    meter = gpu.Meter(torch.device("cpu"))
    if args.world > 1:
        dist.barrier()
    base = meter.start()
    t, cpu = time.perf_counter(), time.process_time()
    la.fit(loader)
    fit_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    peak = meter.peak()
    log_prior = torch.zeros(la.n_layers, requires_grad=True)
    t = time.perf_counter()
    lml = la.log_marginal_likelihood(prior_precision=log_prior.exp())
    lml.backward()
    marglik_s = time.perf_counter() - t
    with torch.no_grad():
        la.prior_precision = torch.ones(la.n_layers)
        pred = la(X_test, pred_type="glm", link_approx="probit")
    out = {"rank": args.rank, "fit_s": fit_s, "cpu_s": cpu_s, "reduce_s": reduce_s[0], "marglik_s": marglik_s,
           "peak_mib": peak / 2**20, "above_mib": (peak - base) / 2**20, "lml": float(lml.detach()), "n_data": la.n_data}
    torch.save({**out, "pred": pred}, Path(args.out_dir) / f"rank{args.rank}.pt")
    if args.world > 1:
        dist.destroy_process_group()


def launch(structure: str, subset: str, world: int, args) -> list[dict]:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--worker", "--structure", structure, "--subset", subset,
               "--world", str(world), "--images", str(args.images), "--batch-size", str(args.batch_size),
               "--init", os.path.join(tmp, "init"), "--out-dir", tmp]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env) for r in range(world)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit(f"a worker failed ({structure}, world {world})")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="JSON file for the rows")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name, typ in (("--structure", str), ("--subset", str), ("--world", int), ("--rank", int),
                      ("--init", str), ("--out-dir", str)):
        p.add_argument(name, type=typ, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    import torch

    rows = []
    print(f"LeNet-5, {args.images} random images, batch {args.batch_size}, float32, gloo, 1 thread per process; "
          f"torch {torch.__version__}; {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}")
    print("| structure | processes | fit s (slowest rank) | of which reduce s | marglik eval s | fit speed-up "
          "| scaling efficiency | fit CPU s (busiest rank) | CPU-time efficiency | peak RSS MiB per rank (above start) | max abs diff log marglik | "
          "max abs diff predictive |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for structure, subset in STRUCTURES:
        runs = {1: [], 2: []}
        for _ in range(args.repeats):
            for world in (1, 2):
                runs[world].append(launch(structure, subset, world, args))
        one = runs[1][0][0]
        t1 = statistics.median(r[0]["fit_s"] for r in runs[1])
        for world in (1, 2):
            fit = statistics.median(max(rk["fit_s"] for rk in r) for r in runs[world])
            cpu = statistics.median(max(rk["cpu_s"] for rk in r) for r in runs[world])
            cpu1 = statistics.median(r[0]["cpu_s"] for r in runs[1])
            red = statistics.median(max(rk["reduce_s"] for rk in r) for r in runs[world])
            ml = statistics.median(max(rk["marglik_s"] for rk in r) for r in runs[world])
            last = runs[world][-1]
            peak = ", ".join(f"{rk['peak_mib']:.0f} ({rk['above_mib']:.0f})" for rk in last)
            d_lml = max(abs(rk["lml"] - one["lml"]) for r in runs[world] for rk in r)
            d_pred = max(float((rk["pred"] - one["pred"]).abs().max()) for r in runs[world] for rk in r)
            assert all(rk["n_data"] == args.images for r in runs[world] for rk in r)
            row = {"structure": f"{structure} ({subset})", "processes": world, "fit_s": fit, "reduce_s": red,
                   "marglik_s": ml, "speedup": t1 / fit, "efficiency": t1 / (world * fit), "cpu_s": cpu,
                   "cpu_efficiency": cpu1 / (world * cpu), "peak_mib": peak,
                   "diff_lml": d_lml, "diff_pred": d_pred, "lml": one["lml"]}
            rows.append(row)
            print(f"| {row['structure']} | {world} | {fit:.2f} | {red:.3f} | {ml:.4f} | {row['speedup']:.2f} | "
                  f"{row['efficiency']:.2f} | {cpu:.2f} | {row['cpu_efficiency']:.2f} | {peak} | {d_lml:.2e} | {d_pred:.2e} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
