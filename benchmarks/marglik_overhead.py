"""Benchmark: cost of online marglik (Immer et al. 2021, Alg. 1) per training epoch.

LeNet-5 on the first 10k MNIST training images, batch 128, KFAC, F=1, K=100, 3 epochs, 2 torch
threads. Reported per method: median epoch time (training + marglik step) as a multiple of a
plain MAP epoch measured in the same run (our Lightning loop, and a bare PyTorch loop), the
speed-up against laplace-torch's ``marglik_training`` (its curvlinops and backpack backends;
its default asdl backend is not installable here), and, for the fused modes, how far the final
log marglik and the test metrics are from the exact pass.

    .venv/bin/python benchmarks/marglik_overhead.py [--epochs 3] [--n-steps 100] [--n-train 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pytorch_lightning as pl
import torch
from torch import nn

from laplace_lab.data import VisionDataModule
from laplace_lab.models import LeNet
from laplace_lab.training import MAPModule
from laplace_lab.training.online_marglik import OnlineMarglik

DATA_DIR = os.environ.get("LAPLACE_LAB_DATA_DIR", "../shared/data")


class EpochTimer(pl.Callback):
    """Wall time of each training epoch, including every callback's epoch-end work."""

    def __init__(self):
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.times.append(time.perf_counter() - self._start)


def datamodule(n_train: int) -> VisionDataModule:
    dm = VisionDataModule("mnist", data_dir=DATA_DIR, n_train_subset=n_train, batch_size=128, download=False)
    dm.setup("fit")
    return dm


def test_metrics(model: nn.Module, dm: VisionDataModule) -> tuple[float, float]:
    model.eval()
    correct, nll, n = 0, 0.0, 0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            f = model(x)
            correct += int((f.argmax(-1) == y).sum())
            nll += float(nn.functional.cross_entropy(f, y, reduction="sum"))
            n += len(y)
    return correct / n, nll / n


def run_ours(dm, epochs, n_steps, structure_type=None, fused=False):
    """Our Lightning run; ``structure_type=None`` is plain MAP training."""
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    module = MAPModule(model, "classification", n_data=len(dm.train_set),
                       optimizer=lambda p: torch.optim.Adam(p, lr=1e-3))
    timer = EpochTimer()
    callbacks = [timer]
    marglik = None
    if structure_type is not None:
        marglik = OnlineMarglik({"subset_of_weights": "all", "hessian_structure": "kron", "curvature": structure_type},
                                prior_structure="layerwise", frequency=1, n_steps=n_steps, lr_hyp=0.1,
                                early_stopping=False, fused=fused)
        callbacks.insert(0, marglik)
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         accelerator="cpu", callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    acc, nll = test_metrics(model, dm)
    final = marglik.history[-1]["marglik/log_marglik"] if marglik else float("nan")
    return timer.times, acc, nll, final


def run_torch_map(dm, epochs):
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for x, y in dm.train_dataloader():
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        times.append(time.perf_counter() - start)
    return times


def run_laplace_torch(dm, epochs, n_steps, backend_name):
    from laplace import marglik_training
    from laplace.curvature import BackPackGGN, CurvlinopsGGN

    backend = {"curvlinops": CurvlinopsGGN, "backpack": BackPackGGN}[backend_name]
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    start = time.perf_counter()
    la, model, margliks, _ = marglik_training(
        model, dm.train_dataloader(), likelihood="classification", hessian_structure="kron", backend=backend,
        n_epochs=epochs, lr_hyp=0.1, prior_structure="layerwise", n_hypersteps=n_steps, marglik_frequency=1,
        optimizer_kwargs={"lr": 1e-3},
    )
    total = time.perf_counter() - start
    acc, nll = test_metrics(model, dm)
    return [total / epochs] * epochs, acc, nll, -float(margliks[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=100)
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    dm = datamodule(args.n_train)
    print(f"LeNet-5, {args.n_train} MNIST images, batch 128, {args.epochs} epochs, K={args.n_steps}, F=1, "
          f"{torch.get_num_threads()} threads")
    bare = statistics.median(run_torch_map(dm, args.epochs))
    plain, acc0, nll0, _ = run_ours(dm, args.epochs, args.n_steps)
    plain = statistics.median(plain)
    rows = {}
    for name, kw in [("ours exact, KFAC-GGN", {"structure_type": "ggn"}),
                     ("ours exact, KFAC-EF", {"structure_type": "ef"}),
                     ("ours exact, KFAC-MC-Fisher", {"structure_type": "mc_fisher"}),
                     ("ours fused, KFAC-EF", {"structure_type": "ef", "fused": True}),
                     ("ours fused, KFAC-MC-Fisher", {"structure_type": "mc_fisher", "fused": True})]:
        rows[name] = run_ours(dm, args.epochs, args.n_steps, **kw)
    if not args.skip_peer:
        for backend in ("curvlinops", "backpack"):
            try:
                rows[f"laplace-torch marglik_training ({backend})"] = run_laplace_torch(dm, args.epochs, args.n_steps, backend)
            except Exception as err:  # report, never hide
                print(f"laplace-torch ({backend}) failed: {type(err).__name__}: {err}")
    peers = [statistics.median(r[0]) for n, r in rows.items() if n.startswith("laplace-torch")]
    fastest_peer = min(peers) if peers else float("nan")
    print(f"\nplain MAP epoch: Lightning {plain:.2f} s (test acc {acc0:.4f}, nll {nll0:.4f}); bare PyTorch loop {bare:.2f} s")
    print("| method | median epoch [s] | x plain MAP epoch (Lightning) | x bare PyTorch epoch | speed-up vs fastest laplace-torch | final log marglik | test acc | test nll |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (times, acc, nll, lml) in rows.items():
        med = statistics.median(times)
        print(f"| {name} | {med:.2f} | {med / plain:.2f} | {med / bare:.2f} | {fastest_peer / med:.2f} | "
              f"{lml:.1f} | {acc:.4f} | {nll:.4f} |")


if __name__ == "__main__":
    main()
