"""Cost of the linear-mode solve (``fit_linear_mode``) in epochs of MAP training (its CPU budget).

One process, 1 thread, CPU time: LeNet-5 with BatchNorm on the first ``N_TRAIN`` MNIST training
images (batch 16, Adam 1e-3): one training epoch, the KFAC-GGN fit (normgroups prior), then
``fit_linear_mode`` with ``solve_subset=SUBSET`` (``none``: all rows) and ``key=value`` solver
settings. Data from ``LAPLACE_LAB_DATA_DIR`` (else ``data/``).

    python benchmarks/linear_mode_cost.py 5000 1000 n_outer=5 tol=5e-2 round_newton=1 max_newton=3 \
        newton_tol=1e-4 cg_tol=1e-2 cg_max_iter=3
"""

from __future__ import annotations

import logging
import os
import sys
import time

import pytorch_lightning as pl
import torch

from laplace_lab.data import VisionDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.linear_mode import fit_linear_mode
from laplace_lab.models import LeNet
from laplace_lab.training import MAPModule
from laplace_lab.training.hyperparameters import example_input
from laplace_lab.training.module import MAPOptimisation


def parse(value: str):
    if value == "none":
        return None
    return float(value) if any(ch in value for ch in ".e") else int(value)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    n_train, subset = int(sys.argv[1]), parse(sys.argv[2])
    kw = {k: parse(v) for k, v in (a.split("=") for a in sys.argv[3:])}
    pl.seed_everything(0)
    dm = VisionDataModule(name="mnist", data_dir=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"),
                          n_train_subset=n_train, batch_size=16, download=False)
    dm.setup("fit")
    model = LeNet((1, 28, 28), 10, norm="batchnorm")
    module = MAPModule(model, "classification", n_data=dm.n_train,
                       optimisation=MAPOptimisation(optimizer=lambda p: torch.optim.Adam(p, lr=1e-3)))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0)
    start = time.process_time()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    epoch = time.process_time() - start
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                 prior_structure="normgroups", example_input=example_input((1, 28, 28), model))
    start = time.process_time()
    loader = dm.train_eval_dataloader()
    la.fit(loader)
    fit = time.process_time() - start
    data = list(loader)
    start = time.process_time()
    res = fit_linear_mode(la, data, solve_subset=subset, **kw)
    solve = time.process_time() - start
    print(f"N={dm.n_train} subset={subset} {kw}: epoch {epoch:.1f} s CPU, kron fit {fit:.1f} s "
          f"({fit / epoch:.2f} epochs), linear mode {solve:.1f} s ({solve / epoch:.2f} epochs), rounds "
          f"{res.n_outer}, converged {res.converged}, log evidence {float(la.log_marginal_likelihood()):.2f}",
          flush=True)


if __name__ == "__main__":
    main()
