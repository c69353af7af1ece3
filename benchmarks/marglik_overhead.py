"""Benchmark: cost of online marglik (Immer et al. 2021, Alg. 1) per training epoch.

LeNet-5 on the first 10k MNIST training images, batch 128, KFAC, F=1, K=100, 3 epochs, 2 torch
threads. Reported per method: median epoch time (training + marglik step; ``--clock wall`` or
``cpu``) as a multiple of a plain MAP epoch measured in the same run (our Lightning loop, and a
bare PyTorch loop), the
speed-up against laplace-torch's ``marglik_training`` (its curvlinops and backpack backends;
its default asdl backend is not installable here), and, for the fused modes, how far the final
log marglik and the test metrics are from the exact pass (and for the one-sample MC-Fisher, the
Monte-Carlo estimate of the GGN, how far they are from the exact GGN).

With ``--repeats R`` every row (the plain epochs included) runs ``R`` times, interleaved, and each
ratio is the median over repeats of (median epoch of the row) / (median plain epoch of the same
repeat), so a load change between repeats does not bias one row. Our rows also report the
marglik step at the epoch end (fit or, fused, the final flush + eigendecompositions, and the K
hyper steps) from the callback's log.

    .venv/bin/python benchmarks/marglik_overhead.py [--epochs 3] [--n-steps 100] [--n-train 10000]
        [--repeats 1] [--threads 2] [--clock wall] [--methods ggn,ef,mc,fused-ef,fused-mc] [--skip-peer]
        [--device cpu|cuda]

The marglik-step columns come from the callback's log (wall clock either way). ``--device cuda``:
Lightning's GPU accelerator for ours, the model and batches on the GPU for the bare loop and the peer,
``torch.cuda.synchronize()`` before every clock reading (wall clock only).
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
from laplace_lab.training.module import MAPOptimisation
from laplace_lab.training.online_marglik import OnlineMarglik, OnlineMarglikOptions

DATA_DIR = os.environ.get("LAPLACE_LAB_DATA_DIR", "data")  # as conf/paths: the env, else data/
CLOCK = time.perf_counter  # --clock cpu: time.process_time (robust to other jobs on a shared box)
DEVICE = torch.device("cpu")  # --device


def now() -> float:
    """``CLOCK()`` after the device's queued work (CUDA) has finished."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return CLOCK()


class EpochTimer(pl.Callback):
    """Wall time of each training epoch, including every callback's epoch-end work."""

    def __init__(self):
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, module):
        self._start = now()

    def on_train_epoch_end(self, trainer, module):
        self.times.append(now() - self._start)


def datamodule(n_train: int) -> VisionDataModule:
    dm = VisionDataModule(name="mnist", data_dir=DATA_DIR, n_train_subset=n_train, batch_size=128, download=False)
    dm.setup("fit")
    return dm


def test_metrics(model: nn.Module, dm: VisionDataModule) -> tuple[float, float]:
    model.eval()
    device = next(model.parameters()).device
    correct, nll, n = 0, 0.0, 0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            x, y = x.to(device), y.to(device)
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
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.Adam(p, lr=1e-3)))
    timer = EpochTimer()
    callbacks = [timer]
    marglik = None
    if structure_type is not None:
        marglik = OnlineMarglik(OnlineMarglikOptions({"subset_of_weights": "all", "hessian_structure": "kron", "curvature": structure_type},
                                                     prior_structure="layerwise", frequency=1, n_steps=n_steps, lr_hyp=0.1,
                                                     early_stopping=False, fused=fused))
        callbacks.insert(0, marglik)
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         accelerator="gpu" if DEVICE.type == "cuda" else "cpu", devices=1, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    acc, nll = test_metrics(model, dm)
    final = marglik.history[-1]["marglik/log_marglik"] if marglik else float("nan")
    # per marglik step: (fit or fused accumulation, hyper steps) seconds
    steps = [(h["marglik/fit_time_s"], h["marglik/time_s"] - h["marglik/fit_time_s"]) for h in marglik.history] \
        if marglik else []
    return timer.times, acc, nll, final, steps


def run_torch_map(dm, epochs):
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for _ in range(epochs):
        start = now()
        for x, y in dm.train_dataloader():
            x, y = x.to(DEVICE), y.to(DEVICE)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        times.append(now() - start)
    return times


def run_laplace_torch(dm, epochs, n_steps, backend_name):
    from laplace import marglik_training
    from laplace.curvature import BackPackGGN, CurvlinopsGGN

    backend = {"curvlinops": CurvlinopsGGN, "backpack": BackPackGGN}[backend_name]
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10).to(DEVICE)
    start = now()
    la, model, margliks, _ = marglik_training(
        model, dm.train_dataloader(), likelihood="classification", hessian_structure="kron", backend=backend,
        n_epochs=epochs, lr_hyp=0.1, prior_structure="layerwise", n_hypersteps=n_steps, marglik_frequency=1,
        optimizer_kwargs={"lr": 1e-3},
    )
    total = now() - start
    acc, nll = test_metrics(model, dm)
    return [total / epochs] * epochs, acc, nll, -float(margliks[-1]), []


METHODS = {
    "ggn": ("ours exact, KFAC-GGN", {"structure_type": "ggn"}),
    "ef": ("ours exact, KFAC-EF", {"structure_type": "ef"}),
    "mc": ("ours exact, KFAC-MC-Fisher", {"structure_type": "mc_fisher"}),
    "fused-ef": ("ours fused, KFAC-EF", {"structure_type": "ef", "fused": True}),
    "fused-mc": ("ours fused, KFAC-MC-Fisher", {"structure_type": "mc_fisher", "fused": True}),
}
# (row, the row it approximates): the fused passes against the exact pass of the same curvature, and
# the one-sample Monte-Carlo GGN (``mc_fisher``: sampled labels, one backward) against the exact GGN
APPROXIMATES = {"ours fused, KFAC-EF": "ours exact, KFAC-EF", "ours fused, KFAC-MC-Fisher": "ours exact, KFAC-MC-Fisher",
                "ours exact, KFAC-MC-Fisher": "ours exact, KFAC-GGN"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=100)
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: perf_counter; cpu: process CPU time (for a loaded machine, with --threads 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (wall clock only)")
    args = parser.parse_args()
    global CLOCK, DEVICE
    CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and (args.clock != "wall" or not torch.cuda.is_available()):
        parser.error("--device cuda needs a CUDA device and --clock wall")
    torch.set_num_threads(args.threads)
    dm = datamodule(args.n_train)
    print(f"LeNet-5, {args.n_train} MNIST images, batch 128, {args.epochs} epochs, K={args.n_steps}, F=1, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeat(s), {args.clock} clock, device {DEVICE}")
    methods = [METHODS[m] for m in args.methods.split(",") if m]
    peers = [] if args.skip_peer else ["curvlinops", "backpack"]
    runs: dict[str, list] = {}  # name -> per repeat (times, acc, nll, lml, steps)
    plain_runs, bare_runs = [], []
    for rep in range(args.repeats):
        bare_runs.append(statistics.median(run_torch_map(dm, args.epochs)))
        plain_runs.append(run_ours(dm, args.epochs, args.n_steps))
        for name, kw in methods:
            runs.setdefault(name, []).append(run_ours(dm, args.epochs, args.n_steps, **kw))
        for backend in peers:
            name = f"laplace-torch marglik_training ({backend})"
            try:
                runs.setdefault(name, []).append(run_laplace_torch(dm, args.epochs, args.n_steps, backend))
            except Exception as err:  # report, never hide
                print(f"laplace-torch ({backend}) failed: {type(err).__name__}: {err}")
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    plain_meds = [statistics.median(r[0]) for r in plain_runs]
    med = statistics.median

    def ratio(name, ref):  # median over repeats of the per-repeat ratio
        return med([med(r[0]) / ref[i] for i, r in enumerate(runs[name])])

    peer_names = [n for n in runs if n.startswith("laplace-torch") and len(runs[n]) == args.repeats]
    fastest = min((ratio(n, plain_meds) for n in peer_names), default=float("nan"))
    acc0, nll0 = plain_runs[0][1], plain_runs[0][2]
    print(f"\nplain MAP epoch: Lightning {med(plain_meds):.2f} s (test acc {acc0:.4f}, nll {nll0:.4f}); "
          f"bare PyTorch loop {med(bare_runs):.2f} s")
    print("| method | median epoch [s] | x plain MAP epoch (Lightning) | x bare PyTorch epoch | speed-up vs fastest "
          "laplace-torch | marglik step: fit / accumulation [s] | marglik step: K hyper steps [s] | final log marglik "
          "| test acc | test nll |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        if len(rs) != args.repeats:
            continue
        x_plain = ratio(name, plain_meds)
        steps = [s for r in rs for s in r[4]]
        fit_s = f"{med([s[0] for s in steps]):.3f}" if steps else "-"
        hyp_s = f"{med([s[1] for s in steps]):.3f}" if steps else "-"
        last = rs[-1]
        print(f"| {name} | {med([med(r[0]) for r in rs]):.2f} | {x_plain:.2f} | {ratio(name, bare_runs):.2f} | "
              f"{fastest / x_plain:.2f} | {fit_s} | {hyp_s} | {last[3]:.1f} | {last[1]:.4f} | {last[2]:.4f} |")
    gaps = [(f, e) for f, e in APPROXIMATES.items() if f in runs and e in runs]
    if gaps:
        print("\napproximation vs what it approximates (same seed, last repeat): final log marglik, test acc, test nll")
        for f, e in gaps:
            (_, fa, fn, fl, _), (_, ea, en, el, _) = runs[f][-1], runs[e][-1]
            print(f"- {f}: log marglik {fl:.1f} vs {el:.1f} ({100 * (fl - el) / abs(el):+.1f}%), "
                  f"acc {fa:.4f} vs {ea:.4f} ({fa - ea:+.4f}), nll {fn:.4f} vs {en:.4f} ({fn - en:+.4f})")


if __name__ == "__main__":
    main()
