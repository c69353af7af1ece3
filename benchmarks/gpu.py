"""Benchmark: the engine beside laplace-torch on one device, every headline workload in one script.

Run on a lent GPU (under 5 minutes on an H100/H200) or, tiny, on the CPU::

    python benchmarks/gpu.py --device cuda --data-dir DIR --out gpu.json
    python benchmarks/gpu.py --device cpu --smoke --out smoke.json      # seconds

Parts (``--parts``, all by default):

- ``wrn``: WideResNet-16-4 without normalisation (2.7M parameters), KFAC-GGN fit on 4096 random
  CIFAR-shaped images (batch 128): all weights and last layer; log marglik at prior precision 1.
- ``lenet``: LeNet-5 (trained one epoch first), all-weights KFAC-GGN fit on the 60k MNIST training images.
- ``predictive``: the GLM probit predictive ``la(X)`` (default arguments) on the 10k MNIST test images
  with that fit, the TF32 switches on (``torch.backends.cuda.matmul.allow_tf32`` and
  ``torch.backends.cudnn.allow_tf32``): with the engine's default (TF32 off inside, ``laplace.precision``)
  and with ``precision.set_tf32(True)``; the largest probability difference between the two, to
  laplace-torch's predictive (called on batches of 64 images: its cost grows with the square of the
  batch), and to a float64 fit's predictive.
- ``marglik``: one epoch of online marglik (Immer et al. 2021, Algorithm 1: Adam 1e-3, batch 128,
  all-weights KFAC, layerwise prior, F=1, K=100 hyper steps at rate 0.1) from a fresh LeNet-5 on the
  60k MNIST images: ours through the plain training loop (``training.plain_loop``) with the exact GGN
  (its fit at the training batch size, and at batch 1024: fewer, larger kernels on a GPU) and with
  the fused EF, our MAP epoch without marglik, laplace-torch's ``marglik_training``
  (``n_epochs=1``; it refits once more after its last epoch, included in its time), and a bare
  PyTorch training epoch as the unit.

Peers: laplace-torch 0.3 with its curvlinops and backpack backends (``--peers``); a peer that is
not installed or fails is reported as such and the script goes on. Every timing is wall clock with
``torch.cuda.synchronize()`` before and after, after one warm-up run, the median of up to
``--repeats`` runs within ``--budget-s`` seconds per row (a row whose warm-up alone takes longer
than half the budget reports that one run, marked ``cold``). Peak memory per row: CUDA
``max_memory_allocated`` (reset before each run), on the CPU the process's peak RSS (``VmHWM``,
reset before each run through ``/proc/self/clear_refs``); ``above`` is the peak minus what was
allocated before the run (the model, the data and any earlier fit kept for later parts).
Rows that would start after ``--time-limit-s`` are skipped and listed.

Output: a markdown table on stdout (with the device name, torch version and peer versions) and a
JSON file (``--out``). Needs only torch (the peers: laplace-torch, curvlinops-for-pytorch,
backpack-for-pytorch and their imports: unfoldNd, einconv, linear_operator, einops, opt_einsum,
scipy, torchmetrics); ``laplace_lab`` is imported from ``src/`` when it is not installed. MNIST is read from
``--data-dir`` (raw idx files, optionally ``.gz``, in the folder itself or its ``MNIST/raw``); without
them the LeNet parts run on random tensors and say so.
"""

from __future__ import annotations

import argparse
import copy
import gc
import gzip
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

try:
    import laplace_lab  # noqa: F401
except ImportError:  # a bare checkout (e.g. a GPU machine without the package installed)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from laplace_lab.laplace import Laplace  # noqa: E402
from laplace_lab.training.module import MAPOptimisation

try:  # the engine's TF32 switch (absent in older checkouts: before/after comparisons)
    from laplace_lab.laplace import precision
except ImportError:
    precision = None
from laplace_lab.models import LeNet, WideResNet  # noqa: E402

PARTS = ("wrn", "lenet", "predictive", "marglik")
PEERS = ("curvlinops", "backpack")
GIB = 2**30
# laplace-torch's GLM predictive (curvlinops backend) costs time and memory quadratic in the batch
# (CPU, LeNet-5: 0.57 GiB for 32 images, 2.35 GiB for 64, 7.8 GiB for 128): batches of 64
PEER_PRED_BATCH = 64


# ------------------------------------------------------------------------------------------- data
def _idx(path: Path) -> torch.Tensor:
    """An MNIST idx file (``.gz`` or raw) as a uint8 tensor."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(shape)


def _find(folder: Path, name: str) -> Path | None:
    for sub in (folder, folder / "MNIST" / "raw", folder / "raw"):
        for candidate in (sub / name, sub / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def mnist(data_dir: str | None, train: bool, n: int, device) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(X [n, 1, 28, 28] standardised, y [n], source)``; random tensors if the files are absent."""
    prefix = "train" if train else "t10k"
    images = _find(Path(data_dir), f"{prefix}-images-idx3-ubyte") if data_dir else None
    labels = _find(Path(data_dir), f"{prefix}-labels-idx1-ubyte") if data_dir else None
    if images is not None and labels is not None:
        X = _idx(images)[:n].float().div(255.0).unsqueeze(1)
        y = _idx(labels)[:n].long()
        source = "MNIST"
    else:
        g = torch.Generator().manual_seed(1 if train else 2)
        X = torch.rand(n, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
        source = "random (no MNIST files under --data-dir)"
    return ((X - 0.1307) / 0.3081).to(device), y.to(device), source


class DeviceBatches:
    """Batches of tensors already on the device (one index per batch, no DataLoader workers);
    ``dataset`` gives ``len(loader.dataset)`` as laplace-torch expects."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = False, seed: int = 0):
        self.X, self.y, self.batch_size, self.shuffle = X, y, batch_size, shuffle
        self.dataset = torch.utils.data.TensorDataset(X, y)
        self.generator = torch.Generator(device=X.device).manual_seed(seed) if shuffle else None

    def __len__(self) -> int:
        return math.ceil(len(self.X) / self.batch_size)

    def __iter__(self):
        n = len(self.X)
        if not self.shuffle:
            for i in range(0, n, self.batch_size):
                yield self.X[i:i + self.batch_size], self.y[i:i + self.batch_size]
            return
        perm = torch.randperm(n, device=self.X.device, generator=self.generator)
        for i in range(0, n, self.batch_size):
            idx = perm[i:i + self.batch_size]
            yield self.X[idx], self.y[idx]


class TensorDataModule:
    """What ``training.plain_loop.PlainTrainer`` and ``OnlineMarglikCore`` read from a data module."""

    def __init__(self, X, y, batch_size: int, seed: int = 0):
        self.X, self.y, self.batch_size, self.seed = X, y, batch_size, seed
        self.input_shape = tuple(X.shape[1:])

    def prepare_data(self):
        pass

    def setup(self, stage=None):
        pass

    def train_dataloader(self):
        return DeviceBatches(self.X, self.y, self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self):
        return []

    def train_eval_dataloader(self, batch_size=None):
        return DeviceBatches(self.X, self.y, batch_size or self.batch_size)


# ------------------------------------------------------------------------------------ measurement
class Meter:
    """Peak memory of one run: CUDA ``max_memory_allocated``, else the process's ``VmHWM``."""

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @staticmethod
    def _status(key: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key))
        except (OSError, StopIteration):
            return None

    def start(self) -> int | None:
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        try:  # reset the peak RSS to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return None
        return self._status("VmRSS:")

    def peak(self) -> int | None:
        self.sync()
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return self._status("VmHWM:")


def cleanup(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Runner:
    """Runs rows (one workload of one implementation), keeps the results, enforces the time limit."""

    def __init__(self, device, repeats: int, budget_s: float, time_limit_s: float):
        self.device, self.meter = device, Meter(device)
        self.repeats, self.budget_s, self.time_limit_s = repeats, budget_s, time_limit_s
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _once(self, fn):
        base = self.meter.start()
        start = time.perf_counter()
        value = fn()
        self.meter.sync()
        seconds = time.perf_counter() - start
        peak = self.meter.peak()
        return seconds, peak, (peak - base if peak is not None and base is not None else None), value

    def row(self, part: str, work: str, impl: str, fn, warmup: bool = True, **info) -> dict:
        """Time ``fn`` (returns a dict of extra values, or ``None``); never raises."""
        row = {"part": part, "work": work, "impl": impl, **info}
        if self.elapsed() > self.time_limit_s:
            row["error"] = f"skipped: past --time-limit-s {self.time_limit_s:g}"
            self.rows.append(row)
            print(f"  {work} / {impl}: {row['error']}", flush=True)
            return row
        runs, cold = [], False
        try:
            start = time.perf_counter()
            first = self._once(fn)
            if not warmup or first[0] > self.budget_s / 2:
                runs, cold = [first], warmup
            while len(runs) < self.repeats and (time.perf_counter() - start) + first[0] < self.budget_s:
                runs.append(self._once(fn))
            if not runs:
                runs, cold = [first], True
        except Exception as err:  # a peer (or we) failing must not stop the benchmark
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
            row["traceback"] = traceback.format_exc()[-2000:]
            print(f"  {work} / {impl}: FAILED {row['error']}", flush=True)
            self.rows.append(row)
            cleanup(self.device)
            return row
        times = [r[0] for r in runs]
        peaks = [r[1] for r in runs if r[1] is not None]
        aboves = [r[2] for r in runs if r[2] is not None]
        row.update(seconds=statistics.median(times), times=times, runs=len(runs), cold=cold,
                   peak_gib=max(peaks) / GIB if peaks else None, above_gib=max(aboves) / GIB if aboves else None)
        extra = runs[-1][3] or {}
        row.update({k: v for k, v in extra.items() if not isinstance(v, torch.Tensor)})
        row["_tensors"] = {k: v for k, v in extra.items() if isinstance(v, torch.Tensor)}
        self.rows.append(row)
        mem = f", peak {row['peak_gib']:.3f} GiB (above {row['above_gib']:.3f})" if peaks and aboves else ""
        print(f"  {work} / {impl}: {row['seconds']:.3f} s ({len(runs)} run{'s' if len(runs) > 1 else ''}"
              f"{', cold' if cold else ''}){mem}", flush=True)
        return row


@contextmanager
def tf32(allowed: bool):
    """The global TF32 switches (CUDA matmuls and cuDNN convolutions), restored after."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


# ------------------------------------------------------------------------------------------ peers
def peer_versions(peers) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("laplace-torch", "curvlinops-for-pytorch", "backpack-for-pytorch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import laplace  # noqa: F401
            from laplace import curvature  # noqa: F401
    except Exception as err:
        out["import laplace"] = f"{type(err).__name__}: {err}"
    return out


def peer_backend(name: str):
    from laplace import curvature

    classes = {"curvlinops": "CurvlinopsGGN", "backpack": "BackPackGGN"}
    if not hasattr(curvature, classes[name]):
        raise ImportError(f"laplace.curvature has no {classes[name]} (is {name} installed?)")
    return getattr(curvature, classes[name])


def peer_laplace(model, subset: str, backend: str):
    import laplace

    return laplace.Laplace(model, "classification", subset_of_weights=subset, hessian_structure="kron",
                           backend=peer_backend(backend))


# ------------------------------------------------------------------------------------------- parts
def fit_row(runner, part, work, impl, pristine, loader, subset, keep=None):
    """Row: fit ``impl``'s all-/last-layer KFAC-GGN on ``loader`` with its own copy of ``pristine``
    (BackPACK's ``extend`` leaves hooks and tensors on a model); log marglik at prior 1."""
    model = copy.deepcopy(pristine)

    def fn():
        if impl == "ours":
            la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure="kron")
        else:
            la = peer_laplace(model, subset, impl.split()[-1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            la.fit(loader)
            lml = float(la.log_marginal_likelihood())
        if keep is not None:
            keep[impl] = la
        return {"log_marglik": lml}

    return runner.row(part, work, impl, fn)


def part_wrn(runner, args, peers):
    device = runner.device
    torch.manual_seed(0)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    depth, width = (10, 1) if args.smoke else (16, 4)
    model = WideResNet(shape, 10, depth=depth, widen_factor=width, norm="none").to(device)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    X = torch.randn(args.wrn_images, *shape, generator=g).to(device)
    y = torch.randint(0, 10, (args.wrn_images,), generator=g).to(device)
    loader = DeviceBatches(X, y, args.wrn_batch)
    name = f"WRN-{depth}-{width} no norm ({n_params / 1e6:.2f}M), {args.wrn_images} random images, batch {args.wrn_batch}"
    for subset, label in (("all", "all-weights KFAC-GGN fit"), ("last_layer", "last-layer KFAC-GGN fit")):
        for impl in ["ours", *(f"laplace-torch {p}" for p in peers)]:
            fit_row(runner, "wrn", f"{name}: {label}", impl, model, loader, subset)
            cleanup(device)
    del model, X, y, loader


def train_epoch(model, loader, lr=1e-3):
    """One bare PyTorch epoch: Adam, mean cross-entropy."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for X, y in loader:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model


def part_lenet(runner, args, peers, data, keep):
    device = runner.device
    X, y, source = data["train"]
    model = data["trained"]
    loader = DeviceBatches(X, y, 128)
    work = f"LeNet-5 (trained 1 epoch), {len(X)} {source} training images, batch 128: all-weights KFAC-GGN fit"
    for impl in ["ours", *(f"laplace-torch {p}" for p in peers)]:
        fit_row(runner, "lenet", work, impl, model, loader, "all", keep=keep)
        cleanup(device)


def _max_diff(a, b) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max())


def part_predictive(runner, args, peers, data, keep):
    device = runner.device
    Xt, _, source = data["test"]
    model = data["trained"]
    work = f"GLM probit la(X) on {len(Xt)} {source} test images (LeNet-5 all-weights KFAC, fit on the training images)"
    la = keep.get("ours")
    if la is None:
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
        X, y, _ = data["train"]
        la.fit(DeviceBatches(X, y, 128))
        keep["ours"] = la
    probs = {}
    cases = ((False, "ours, engine default (TF32 off inside), TF32 switches on"),
             (True, "ours, set_tf32(True), TF32 switches on"))
    for allowed, label in cases if precision is not None else ((None, "ours, TF32 switches on"),):
        def fn(allowed=allowed):
            if precision is None:
                with tf32(True), torch.no_grad():
                    return {"probs": la(Xt)}
            precision.set_tf32(allowed)
            try:
                with tf32(True), torch.no_grad():
                    return {"probs": la(Xt)}
            finally:
                precision.set_tf32(False)

        row = runner.row("predictive", work, label, fn)
        if "_tensors" in row:
            probs[label] = row["_tensors"]["probs"]
    for p in peers:
        impl = f"laplace-torch {p}"
        peer = keep.get(impl)
        if peer is None:
            continue

        def fn(peer=peer):
            with tf32(False), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return {"probs": torch.cat([peer(xb, pred_type="glm", link_approx="probit")
                                            for xb in torch.split(Xt[:args.n_test_peer], PEER_PRED_BATCH)])}

        label = f"{impl}, TF32 off, batches of {PEER_PRED_BATCH}" + (
            f", first {args.n_test_peer} images" if args.n_test_peer < len(Xt) else "")
        row = runner.row("predictive", work, label, fn)
        if "_tensors" in row:
            probs[row["impl"]] = row["_tensors"]["probs"]
    # float64 reference: the same network and fit data in double precision
    if runner.elapsed() < runner.time_limit_s:
        try:
            model64 = copy.deepcopy(model).double()
            X, y, _ = data["train"]
            la64 = Laplace(model64, "classification", subset_of_weights="all", hessian_structure="kron")
            la64.fit(DeviceBatches(X.double(), y, 128))
            with torch.no_grad():
                probs["float64"] = la64(Xt.double())
            del la64, model64
        except Exception as err:
            print(f"  float64 reference failed: {type(err).__name__}: {err}", flush=True)
    diffs = {}
    names = list(probs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            n = min(len(probs[a]), len(probs[b]))
            diffs[f"{a} vs {b}" + (f" (first {n} images)" if n < len(Xt) else "")] = _max_diff(probs[a][:n], probs[b][:n])
    for row in runner.rows:
        row.get("_tensors", {}).pop("probs", None)
    cleanup(device)
    return diffs


class _Core:
    """Our online-marglik callback, created lazily (imports the training package)."""

    @staticmethod
    def make(curvature: str, fused: bool, n_steps: int, fit_batch_size: int | None = None):
        from laplace_lab.training.online_marglik import OnlineMarglikCore, OnlineMarglikOptions

        return OnlineMarglikCore(OnlineMarglikOptions({"subset_of_weights": "all", "hessian_structure": "kron", "curvature": curvature},
                                                      prior_structure="layerwise", frequency=1, n_steps=n_steps, lr_hyp=0.1,
                                                      early_stopping=False, fused=fused, fit_batch_size=fit_batch_size))


def part_marglik(runner, args, peers, data):
    device = runner.device
    X, y, source = data["train"]
    work = (f"one online-marglik epoch, LeNet-5 from init, {len(X)} {source} images, batch 128, Adam 1e-3, "
            f"all-weights KFAC, layerwise prior, K={args.n_steps}")

    def fresh():
        torch.manual_seed(0)
        return LeNet((1, 28, 28), 10).to(device)

    def bare():
        train_epoch(fresh(), DeviceBatches(X, y, 128, shuffle=True))

    def ours(curvature=None, fused=False, fit_batch_size=None):
        from laplace_lab.training.module import MAPCore
        from laplace_lab.training.plain_loop import PlainTrainer

        def fn():
            model = fresh()
            module = MAPCore(model, "classification", n_data=len(X),
                             optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.Adam(p, lr=1e-3)))
            callbacks = [] if curvature is None else [_Core.make(curvature, fused, args.n_steps, fit_batch_size)]
            PlainTrainer(1, device, callbacks=callbacks).fit(module, TensorDataModule(X, y, 128))
            if not callbacks:
                return None
            h = callbacks[0].history[-1]
            return {"log_marglik": h["marglik/log_marglik"], "marglik_fit_s": h["marglik/fit_time_s"],
                    "hyper_steps_s": h["marglik/time_s"] - h["marglik/fit_time_s"]}

        return fn

    def peer(backend):
        def fn():
            from laplace import marglik_training

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                la, _, margliks, _ = marglik_training(
                    fresh(), DeviceBatches(X, y, 128, shuffle=True), likelihood="classification",
                    hessian_structure="kron", backend=peer_backend(backend), n_epochs=1, lr_hyp=0.1,
                    prior_structure="layerwise", n_hypersteps=args.n_steps, marglik_frequency=1,
                    optimizer_kwargs={"lr": 1e-3})
            return {"log_marglik": -float(margliks[-1])}

        return fn

    unit = runner.row("marglik", work, "bare PyTorch training epoch (unit)", bare)
    runner.row("marglik", work, "ours: MAP epoch, no marglik (plain loop)", ours())
    runner.row("marglik", work, "ours: marglik epoch, exact KFAC-GGN", ours("ggn"))
    runner.row("marglik", work, "ours: marglik epoch, exact KFAC-GGN, fit batch 1024",
               ours("ggn", fit_batch_size=min(1024, len(X))))
    runner.row("marglik", work, "ours: marglik epoch, fused KFAC-EF", ours("ef", fused=True))
    for p in peers:
        runner.row("marglik", work, f"laplace-torch marglik_training {p} (+ its final refit)", peer(p),
                   warmup=False)
    cleanup(device)
    return unit


# ------------------------------------------------------------------------------------------ report
def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def markdown(runner, header: list[str], diffs: dict) -> str:
    lines = [*header, ""]
    parts = [p for p in PARTS if any(r["part"] == p for r in runner.rows)]
    for part in parts:
        rows = [r for r in runner.rows if r["part"] == part]
        works = list(dict.fromkeys(r["work"] for r in rows))
        for work in works:
            wr = [r for r in rows if r["work"] == work]
            if part == "marglik":
                ref = next((r for r in wr if "unit" in r["impl"] and "seconds" in r), None)
                ref_name = "x bare epoch"
            else:
                ref = next((r for r in wr if r["impl"].startswith("ours") and "seconds" in r), None)
                ref_name = "time / ours"
            lines += [f"**{work}**", "",
                      f"| impl | median s | runs | {ref_name} | peak GiB | above GiB | mem / ours | log marglik | notes |",
                      "|---|---|---|---|---|---|---|---|---|"]
            ours_mem = next((r.get("above_gib") for r in wr if r["impl"].startswith("ours") and "seconds" in r), None)
            for r in wr:
                if "error" in r:
                    lines.append(f"| {r['impl']} | - | - | - | - | - | - | - | {r['error']} |")
                    continue
                ratio = r["seconds"] / ref["seconds"] if ref else None
                mem = r["above_gib"] / ours_mem if (ours_mem and r.get("above_gib") is not None) else None
                notes = []
                if r.get("cold"):
                    notes.append("cold (no warm-up)")
                if "hyper_steps_s" in r:
                    notes.append(f"marglik fit {r['marglik_fit_s']:.3f} s, hyper steps {r['hyper_steps_s']:.3f} s")
                lines.append(f"| {r['impl']} | {r['seconds']:.3f} | {r['runs']} | {_fmt(ratio, '.2f')} | "
                             f"{_fmt(r.get('peak_gib'))} | {_fmt(r.get('above_gib'))} | {_fmt(mem, '.2f')} | "
                             f"{_fmt(r.get('log_marglik'), '.2f')} | {'; '.join(notes)} |")
            lines.append("")
    if diffs:
        lines += ["**largest absolute difference between predictive probabilities**", "",
                  "| pair | max abs diff |", "|---|---|"]
        lines += [f"| {k} | {v:.3g} |" for k, v in diffs.items()]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds on a CPU)")
    p.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR"),
                   help="folder with the MNIST idx files (or MNIST/raw/ below it); default $LAPLACE_LAB_DATA_DIR")
    p.add_argument("--out", help="JSON file for the rows")
    p.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)}, or none")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per row after the warm-up (3; smoke 1)")
    p.add_argument("--budget-s", type=float, default=None, help="seconds per row for warm-up + repeats (20; smoke 2)")
    p.add_argument("--time-limit-s", type=float, default=270.0, help="rows starting later are skipped")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    peers = [x for x in args.peers.split(",") if x and x != "none"]
    bad = [x for x in parts if x not in PARTS] + [x for x in peers if x not in PEERS]
    if bad:
        p.error(f"unknown --parts/--peers values {bad}; allowed parts {list(PARTS)}, peers {list(PEERS)} or none")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = dict(wrn_images=32, wrn_batch=16, n_train=256, n_test=128, n_test_peer=16, n_steps=5) if args.smoke \
        else dict(wrn_images=4096, wrn_batch=128, n_train=60000, n_test=10000, n_test_peer=10000, n_steps=100)
    for k, v in sizes.items():
        setattr(args, k, v)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 3)
    args.budget_s = args.budget_s if args.budget_s is not None else (2.0 if args.smoke else 20.0)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    versions = peer_versions(peers) if peers else {}
    header = [f"# benchmarks/gpu.py on {dev_name}", "",
              f"torch {torch.__version__}; float32; " + ", ".join(f"{k} {v}" for k, v in versions.items())
              + f"; {'smoke sizes' if args.smoke else 'full sizes'}; medians of up to {args.repeats} runs after one "
              f"warm-up; TF32 defaults: matmul {torch.backends.cuda.matmul.allow_tf32}, "
              f"cuDNN {torch.backends.cudnn.allow_tf32}"]
    print("\n".join(header), flush=True)
    runner = Runner(device, args.repeats, args.budget_s, args.time_limit_s)
    data, keep, diffs = {}, {}, {}
    if any(x in parts for x in ("lenet", "predictive", "marglik")):
        data["train"] = mnist(args.data_dir, True, args.n_train, device)
        data["test"] = mnist(args.data_dir, False, args.n_test, device)
        torch.manual_seed(0)
        start = time.perf_counter()
        trained = train_epoch(LeNet((1, 28, 28), 10).to(device), DeviceBatches(*data["train"][:2], 128, shuffle=True))
        Meter(device).sync()
        print(f"trained LeNet-5 one epoch on {args.n_train} images ({data['train'][2]}) in "
              f"{time.perf_counter() - start:.2f} s (first epoch, includes warm-up)", flush=True)
        data["trained"] = trained.eval()
    if "wrn" in parts:
        part_wrn(runner, args, peers)
    if "lenet" in parts:
        part_lenet(runner, args, peers, data, keep)
    if "predictive" in parts:
        diffs = part_predictive(runner, args, peers, data, keep)
    keep.clear()
    cleanup(device)
    if "marglik" in parts:
        part_marglik(runner, args, peers, data)
    header.append(f"total wall time {runner.elapsed():.0f} s")
    text = markdown(runner, header, diffs)
    print("\n" + text, flush=True)
    if args.out:
        rows = [{k: v for k, v in r.items() if k != "_tensors"} for r in runner.rows]
        Path(args.out).write_text(json.dumps({"device": dev_name, "torch": torch.__version__, "peers": versions,
                                              "smoke": args.smoke, "rows": rows, "prob_diffs": diffs,
                                              "total_s": runner.elapsed()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
