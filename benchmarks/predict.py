"""Benchmark: GLM probit predictive on LeNet-5 / MNIST, ours beside laplace-torch 0.3.

LeNet-5 trained for 1 epoch (Adam 1e-3, batch 64, full MNIST train set, pixels / 255), posterior
fitted on the first 10k training images (GGN; scalar prior 1), GLM probit predictive on test
images in batches of 128, ``torch.set_num_threads(2)``, float32. Methods: all-weights kron, all-weights
diag, last-layer kron; the MAP forward pass (the plain network on the same batches) is timed
in the same worker right after each predictive pass (the CPUs are shared, so only same-worker
ratios are robust). Each (implementation, method) runs in its own subprocess; peak memory is that
worker's ``ru_maxrss`` (fit + predictive + ~0.5-1 GiB of torch and data); "fit RSS" is the
high-water mark before the predictive starts.

laplace-torch (default curvlinops backend) forms per-input Jacobians over all weights, so it runs on
fewer test images (``--n-peer-kron`` for all-weights kron, ``--n-peer`` for the others) and its
posterior is fitted on ``--n-fit-peer`` training images (its all-weights fit on 10k images does not
finish / runs out of memory; the predictive's cost does not depend on the fit data). Nothing is
cached in the repository: the trained weights live in a temporary directory for the run.

    .venv/bin/python benchmarks/predict.py [--n-test 10000] [--repeats 3]
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
import warnings

METHODS = {"all kron": ("all", "kron"), "all diag": ("all", "diag"), "last-layer kron": ("last_layer", "kron")}


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _mnist(train: bool, n: int | None):
    import torchvision

    root = os.environ.get("LAPLACE_LAB_DATA_DIR", "data")  # as conf/paths: the env, else data/
    ds = torchvision.datasets.MNIST(root=root, train=train, download=False)
    X = (ds.data[:n].float() / 255.0).unsqueeze(1)
    return X, ds.targets[:n].clone()


def _model(state_path: str | None = None):
    import torch

    from laplace_lab.models import LeNet

    model = LeNet(input_shape=(1, 28, 28), num_outputs=10)
    if state_path:
        model.load_state_dict(torch.load(state_path, weights_only=True))
    return model


def train(state_path: str) -> float:
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(0)
    X, y = _mnist(True, None)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=64, shuffle=True)
    start = time.perf_counter()
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    torch.save(model.state_dict(), state_path)
    Xt, yt = _mnist(False, None)
    with torch.no_grad():
        acc = (model.eval()(Xt).argmax(-1) == yt).float().mean().item()
    print(f"trained LeNet-5 1 epoch in {time.perf_counter() - start:.1f} s; test accuracy {acc:.4f}", flush=True)
    return acc


# ------------------------------------------------------------------------------------------ worker
def worker(impl: str, method: str, state_path: str, n_images: int, n_fit: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(2)
    model = _model(state_path).eval()
    X, y = _mnist(True, n_fit)
    fit_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=128)
    Xt, _ = _mnist(False, n_images)
    batches = list(torch.split(Xt, 128))
    subset, structure = METHODS.get(method, ("last_layer", "kron"))
    t0 = time.perf_counter()
    if impl == "ours":
        from laplace_lab.laplace import Laplace

        la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
        la.fit(fit_loader)

        def predict(xb):
            return la(xb, pred_type="glm", link_approx="probit")
    else:
        import laplace

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            la = laplace.Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
            la.fit(fit_loader)

        def predict(xb):
            return la(xb, pred_type="glm", link_approx="probit")
    fit_s = time.perf_counter() - t0
    fit_rss = _rss_gib()
    def map_forward(xb):
        with torch.no_grad():
            return torch.softmax(model(xb), -1)

    times, map_times = [], []
    for _ in range(repeats):  # the MAP forward is timed right after each pass (the CPUs are shared)
        for fn, acc in ((predict, times), (map_forward, map_times)):
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for xb in batches:
                    fn(xb)
            acc.append(time.perf_counter() - start)
    return {"impl": impl, "method": method, "images": n_images, "fit_images": n_fit, "fit_s": fit_s,
            "s_per_image": statistics.median(times) / n_images, "map_s_per_image": statistics.median(map_times) / n_images,
            "peak_gib": _rss_gib(), "fit_rss_gib": fit_rss}


def run_worker(args, impl, method, n_images, n_fit, repeats) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", impl, method, args.state, str(n_images), str(n_fit), str(repeats)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"{impl} / {method}: timed out after {args.timeout} s", flush=True)
        return None
    if out.returncode != 0:
        print(f"{impl} / {method}: failed (rc {out.returncode}): {out.stderr[-2000:]}", flush=True)
        return None
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(res), flush=True)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n-test", type=int, default=10000)
    p.add_argument("--n-fit", type=int, default=10000)
    p.add_argument("--n-fit-peer", type=int, default=500)
    p.add_argument("--n-peer", type=int, default=500)
    p.add_argument("--n-peer-kron", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--worker", nargs=6)
    args = p.parse_args()
    if args.worker:
        impl, method, state, n_images, n_fit, repeats = args.worker
        print(json.dumps(worker(impl, method, state, int(n_images), int(n_fit), int(repeats))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.state = os.path.join(tmp, "lenet.pt")
        train(args.state)
        rows = []
        for method in METHODS:
            rows.append(run_worker(args, "ours", method, args.n_test, args.n_fit, args.repeats))
            n_peer = args.n_peer_kron if method == "all kron" else args.n_peer
            rows.append(run_worker(args, "laplace-torch", method, n_peer, args.n_fit_peer, 1))
    res = {(r["impl"], r["method"]): r for r in rows if r}
    print("\n| method | impl | test images | fit images | ms / image | MAP forward ms / image | / MAP forward "
          "| laplace-torch / ours (per image) | peak RSS GiB | RSS after fit GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (impl, method), r in res.items():
        ours = res.get(("ours", method))
        ratio = f"{r['s_per_image'] / ours['s_per_image']:.1f}x" if impl == "laplace-torch" and ours else ""
        print(f"| {method} | {impl} | {r['images']} | {r['fit_images']} | {1e3 * r['s_per_image']:.3f} | "
              f"{1e3 * r['map_s_per_image']:.3f} | {r['s_per_image'] / r['map_s_per_image']:.2f}x | {ratio} | "
              f"{r['peak_gib']:.2f} | {r['fit_rss_gib']:.2f} |")
    for method in METHODS:
        if ("laplace-torch", method) not in res:
            print(f"laplace-torch / {method}: no result (see above)")


if __name__ == "__main__":
    main()
