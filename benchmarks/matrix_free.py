"""Benchmark: matrix-free Laplace on a width-reduced CIFAR ResNet-18.

``ResNet18(input_shape=(3, 32, 32), num_outputs=10, width=8)`` (P = 176,402), eval mode, random
inputs and labels, one batch of 32, float32, 2 torch threads. Each measurement runs in its own
subprocess so peak memory (``ru_maxrss``; on CUDA ``max_memory_allocated``) is per method; the
reported memory is the peak minus the RSS after building model and data. Times are medians over
``--repeats`` (one run for Lanczos and the CG samples). Rows:

- gradient: forward + backward of the summed cross-entropy (the unit of cost).
- GGN-vector product: ``GGNOperator.matvec`` (forward + vjp graph, jvp, vjp); and per vector in
  a batch of 10 (``matmat``, vmap-ed jvp/vjp).
- Lanczos rank k: ``Laplace(..., hessian_structure="lowrank", n_eigs=k).fit`` (loss pass + block
  Lanczos, block 10, 2k steps), with the max relative residual ``||H u - l u|| / l_1`` of the top 10.
- CG samples: ``posterior_samples`` (sample-then-optimise) with the exact diagonal-GGN Jacobi
  preconditioner (from the diag fit), ``--cg-iters`` iterations at most, prior precision 1.
- KFAC / diag: ``Laplace(..., hessian_structure="kron" | "diag").fit`` on the same data. Dense
  (full) is not possible: P^2 = 3.1e10 entries (124 GB in float32).

    .venv/bin/python benchmarks/matrix_free.py [--width 8] [--rank 100] [--n-samples 100] [--cg-iters 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

ROWS = ("gradient", "ggn_vp", "ggn_mm10", "lanczos", "cg_samples", "kron_fit", "diag_fit")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> dict:
    import torch

    from laplace_lab.laplace import Laplace
    from laplace_lab.laplace.matrix_free import GGNOperator, jacobi, posterior_samples
    from laplace_lab.models import ResNet18

    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = ResNet18(input_shape=(3, 32, 32), num_outputs=10, width=args.width).to(dev).eval()
    X = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    data = [(X, y)]
    op = GGNOperator(model, "classification", data, vec_chunk=args.vec_chunk)
    P = op.n_params
    base = _rss_mib()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    info: dict = {"P": P}

    def grad():
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(X), y, reduction="sum").backward()

    v = torch.randn(P, device=dev)
    V10 = torch.randn(P, 10, device=dev)

    def lanczos_fit():
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank",
                     n_eigs=args.rank)
        la.structure.block_size = 10
        la.fit(data)
        s = la.structure
        U, lam = s.U[:, :10], s.eigvals[:10]
        res = (op.matmat(U) - U * lam).norm(dim=0) / lam[0]
        info.update(n_products=s.op.n_products, top_eig=float(lam[0]), k_kept=int(s.eigvals.numel()),
                    ritz_resid=float(res.max()))

    def cg_samples():
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag",
                     prior_precision=1.0)
        la.fit(data)
        d = la.prior_precision_diag
        gen = torch.Generator(device=dev).manual_seed(0)
        _, res = posterior_samples(op, d, 1.0, args.n_samples, generator=gen, precond=jacobi(la.H + d),
                                   tol=args.cg_tol, max_iter=args.cg_iters)
        info.update(cg_iters=res.n_iter, cg_resid=float(res.rel_residual.max()))

    def fit(structure):
        def run():
            Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure).fit(data)
        return run

    fns = {"gradient": grad, "ggn_vp": lambda: op.matvec(v), "ggn_mm10": lambda: op.matmat(V10),
           "lanczos": lanczos_fit, "cg_samples": cg_samples, "kron_fit": fit("kron"), "diag_fit": fit("diag")}
    fn = fns[args.worker]
    repeats = 1 if args.worker in ("lanczos", "cg_samples") else args.repeats
    if repeats > 1:
        fn()  # warm-up
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    info["time_s"] = statistics.median(times)
    info["peak_mib"] = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
                        else _rss_mib() - base)
    info["device"] = str(dev)
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rank", type=int, default=100)
    p.add_argument("--n-samples", type=int, default=100)
    p.add_argument("--cg-iters", type=int, default=8)
    p.add_argument("--cg-tol", type=float, default=1e-2)
    p.add_argument("--vec-chunk", type=int, default=25)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    results = {}
    for row in args.rows.split(","):
        cmd = [sys.executable, __file__, "--worker", row] + [
            a for k, val in vars(args).items() if k not in ("worker", "rows", "timeout")
            for a in (f"--{k.replace('_', '-')}", str(val))]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            results[row] = json.loads(line[-1]) if line else {"error": out.stderr.strip().splitlines()[-1:]}
        except subprocess.TimeoutExpired:
            results[row] = {"error": f"timeout {args.timeout:.0f}s"}
        print(f"# {row}: {results[row]}", file=sys.stderr, flush=True)
    g = results.get("gradient", {}).get("time_s")
    P = next((r["P"] for r in results.values() if "P" in r), "?")
    dev = next((r["device"] for r in results.values() if "device" in r), "?")
    print(f"\nResNet-18 width {args.width}, P = {P}, batch {args.batch}, {dev}, {args.threads} threads; "
          f"times are medians; 'x grad' = time / one gradient computation\n")
    print("| method | time (s) | x grad | peak mem over baseline (MiB) | notes |")
    print("|---|---|---|---|---|")
    names = {"gradient": "gradient (fwd + bwd)", "ggn_vp": "GGN-vector product (1 vector)",
             "ggn_mm10": "GGN-matrix product (10 vectors)", "lanczos": f"Lanczos rank {args.rank} (lowrank fit)",
             "cg_samples": f"{args.n_samples} posterior samples by CG", "kron_fit": "KFAC fit (kron)",
             "diag_fit": "diag-GGN fit (diag)"}
    for row, r in results.items():
        if "error" in r:
            print(f"| {names[row]} | - | - | - | {r['error']} |")
            continue
        notes = ""
        if row == "ggn_mm10":
            notes = f"{r['time_s'] / 10 / g:.2f} x grad per vector" if g else ""
        if row == "lanczos":
            notes = (f"{r['n_products']} batched products (block 10), {r['k_kept']} eigenpairs kept, "
                     f"top-10 Ritz residual {r['ritz_resid']:.1e} x l_1")
        if row == "cg_samples":
            notes = f"{r['cg_iters']} CG iterations, max rel. residual {r['cg_resid']:.1e}; incl. diag fit (Jacobi)"
        ratio = f"{r['time_s'] / g:.1f}" if g else "-"
        print(f"| {names[row]} | {r['time_s']:.2f} | {ratio} | {r['peak_mib']:.0f} | {notes} |")
    print("| dense full GGN | - | - | - | not possible: P^2 floats = "
          f"{(P if isinstance(P, int) else 0) ** 2 * 4 / 1e9:.0f} GB |")


if __name__ == "__main__":
    main()
