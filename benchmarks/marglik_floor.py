"""Benchmark: the floor of a marglik epoch's cost, piece by piece, as multiples of a bare training epoch.

``marglik_overhead.py`` times whole Lightning epochs (wall clock, needs a quiet machine). This script
splits the extra work of an online-marglik epoch into its pieces and times each with the calling
thread's CPU clock (``time.thread_time``) at one torch thread, so the numbers hold on a busy machine
(each piece runs in this thread only; other processes change the cache, not the count):

- ``bare epoch``: forward, backward and Adam step of LeNet-5 over the first ``--n-train`` MNIST
  training images, batch 128 (the denominator; our Lightning epoch adds its own loop overhead).
- fused KFAC-EF (``laplace.fused``): the same epoch with the curvature recorded by the engine's hooks,
  split into ``hooks`` (recording only: the accumulation is skipped) and the ``factor kernels``
  (``Structure.accumulate``, the last chunk's at ``end()`` included; the conv ``A`` factors alone in
  their own row), plus the KFAC eigendecompositions at ``end()``.
- exact KFAC-GGN fit over the same images (``Laplace.fit``, batch ``--fit-batch``), split into
  ``factor kernels`` (conv ``A`` alone again) and the rest (forward, the ``C - 1`` batched backward
  passes of the output factors, loss).

The floor of a fused-EF marglik epoch is ``1 + kernels / bare``: what the exact KFAC factors cost even
if recording and the hyper steps were free (100 hyper steps: ~0.04 s, ``marglik_step.py``). Likewise
``1 + fit / bare`` for the exact GGN. Both are printed beside the targets of a marglik epoch (GGN
``<= 2x``, fused EF ``<= 1.2x`` a MAP epoch).

    .venv/bin/python benchmarks/marglik_floor.py [--n-train 10000] [--repeats 3] [--fit-batch 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager

import torch
from torch import nn

import laplace_lab.laplace.modules as kfac_modules
from laplace_lab.data import VisionDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.fused import FusedCurvature
from laplace_lab.models import LeNet

DATA_DIR = os.environ.get("LAPLACE_LAB_DATA_DIR", "data")  # as conf/paths: the env, else data/
CLOCK = time.thread_time


class Stopwatch:
    """Named accumulating timers on ``CLOCK``; ``wrap`` times every call of a function."""

    def __init__(self):
        self.s: dict[str, float] = {}

    @contextmanager
    def time(self, name: str):
        start = CLOCK()
        try:
            yield
        finally:
            self.s[name] = self.s.get(name, 0.0) + CLOCK() - start

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            with self.time(name):
                return fn(*args, **kwargs)
        return timed


def laplace_of(model: nn.Module, curvature: str) -> Laplace:
    return Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                   curvature=curvature, prior_structure="layerwise")


def epoch(model, opt, loader, fused: FusedCurvature | None = None):
    """One training epoch (batch-mean cross-entropy), recorded by ``fused`` when given."""
    for x, y in loader:
        opt.zero_grad()
        if fused is None:
            nn.functional.cross_entropy(model(x), y).backward()
        else:
            with fused.batch(y, nll_scale=1.0 / len(y)) as rec:
                f = model(x)
                rec.output(f)
            nn.functional.cross_entropy(f, y).backward()
            fused.flush()
        opt.step()


def timed_pieces(dm: VisionDataModule, fit_batch: int, chunk_size: int) -> dict[str, float]:
    """One repeat: every piece's thread CPU seconds (see the module docstring)."""
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = dm.train_dataloader()
    epoch(model, opt, loader)  # warm-up (allocator, oneDNN primitives)
    sw = Stopwatch()
    with sw.time("bare epoch"):
        epoch(model, opt, loader)

    # fused EF, recording only: the chunks are dropped instead of accumulated
    fused = FusedCurvature(laplace_of(model, "ef"))
    fused._accumulate_ready = lambda: fused._ready.clear()
    fused.begin()
    with sw.time("fused EF epoch, hooks only"):
        epoch(model, opt, loader, fused)
    fused._ready_n = 0

    # fused EF in full: kernels timed inside
    conv_A = kfac_modules.conv_A
    kfac_modules.conv_A = sw.wrap("fused EF: conv A factors", conv_A)
    try:
        fused = FusedCurvature(laplace_of(model, "ef"), chunk_size=chunk_size)
        fused.la.structure.accumulate = sw.wrap("fused EF: factor kernels", fused.la.structure.accumulate)
        fused.la.fit_end = sw.wrap("fused EF: eigendecompositions", fused.la.fit_end)
        fused.begin()
        with sw.time("fused EF epoch"):
            epoch(model, opt, loader, fused)
            fused.end()
    finally:
        kfac_modules.conv_A = conv_A

    # exact GGN fit over the same images
    la = laplace_of(model, "ggn")
    fit_loader = dm.train_eval_dataloader(batch_size=fit_batch)
    la.fit(fit_loader)  # warm-up
    la = laplace_of(model, "ggn")
    kfac_modules.conv_A = sw.wrap("GGN fit: conv A factors", conv_A)
    try:
        la.structure.accumulate = sw.wrap("GGN fit: factor kernels", la.structure.accumulate)
        with sw.time("GGN fit"):
            la.fit(fit_loader)
    finally:
        kfac_modules.conv_A = conv_A
    return sw.s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-batch", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=512, help="FusedCurvature(chunk_size=...)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dm = VisionDataModule(name="mnist", data_dir=DATA_DIR, n_train_subset=args.n_train, batch_size=128, download=False)
    dm.setup("fit")
    runs = [timed_pieces(dm, args.fit_batch, args.chunk_size) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    bare = med["bare epoch"]
    print(f"LeNet-5, {args.n_train} MNIST images, batch 128 (GGN fit batch {args.fit_batch}, fused chunk {args.chunk_size}), 1 torch thread, "
          f"thread CPU time, median of {args.repeats}; load average {os.getloadavg()[0]:.2f}")
    print("| piece | CPU s | x bare epoch |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / bare:.3f} |")
    hooks = med["fused EF epoch, hooks only"] - bare
    kernels = med["fused EF: factor kernels"] + med["fused EF: eigendecompositions"]
    print(f"\nfused EF: recording {hooks / bare:+.3f} epochs, exact factor kernels + eigendecompositions {kernels / bare:.3f} epochs "
          f"(conv A {med['fused EF: conv A factors'] / bare:.3f}): floor of a fused-EF marglik epoch "
          f"{1 + kernels / bare:.2f}x a bare epoch (target 1.2x a MAP epoch)")
    print(f"exact GGN: fit {med['GGN fit'] / bare:.3f} epochs (factor kernels {med['GGN fit: factor kernels'] / bare:.3f}, "
          f"conv A {med['GGN fit: conv A factors'] / bare:.3f}): floor of a GGN marglik epoch "
          f"{1 + med['GGN fit'] / bare:.2f}x a bare epoch (target 2x a MAP epoch)")


if __name__ == "__main__":
    main()
