"""Learning-rate schedules stepped after every optimiser step (``interval = "step"``).

An ``lr_scheduler`` config instantiates to ``optimizer -> scheduler``, stepped once per epoch
(e.g. ``torch.optim.lr_scheduler.CosineAnnealingLR`` with ``T_max`` in epochs). A per-step
schedule needs the run's number of optimiser steps, which is known only when training starts, so
it is a factory object with ``interval = "step"`` called as ``factory(optimizer, total_steps)``;
``MAPCore.configure_optimizers`` passes the trainer's ``estimated_stepping_batches`` (epochs x
batches per epoch) and both loops (Lightning's and ``training.plain_loop``) step it after each
optimiser step.
"""

from __future__ import annotations

import torch

SCHEDULER_INTERVALS = ("epoch", "step")


class StepwiseCosine:
    """Cosine decay from the optimiser's lr to ``eta_min`` over every optimiser step of the run:
    ``CosineAnnealingLR(optimizer, T_max=total_steps, eta_min)`` stepped after each batch (the
    Laplace Redux authors' MAP recipe; ``conf/lr_scheduler/cosine_per_step.yaml``)."""

    interval = "step"

    def __init__(self, eta_min: float = 0.0):
        if eta_min < 0:
            raise ValueError(f"lr_scheduler.eta_min must be >= 0; got {eta_min!r}")
        self.eta_min = float(eta_min)

    def __call__(self, optimizer: torch.optim.Optimizer, total_steps: int):
        if int(total_steps) < 1:
            raise ValueError(f"a per-step schedule needs the run's number of optimiser steps (>= 1); got {total_steps!r}")
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(total_steps), eta_min=self.eta_min)


def scheduler_interval(factory) -> str:
    """``"step"`` for a per-step factory (this module), else ``"epoch"``."""
    interval = getattr(factory, "interval", "epoch")
    if interval not in SCHEDULER_INTERVALS:
        raise ValueError(f"lr scheduler interval={interval!r} is not supported; allowed: {list(SCHEDULER_INTERVALS)}")
    return interval
