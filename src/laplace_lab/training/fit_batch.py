"""The batch of a run's Laplace fit loader (``curvature.fit_batch_size``): null (``data.eval_batch_size``)
and integers as given; ``auto`` chosen from the memory budget by ``laplace.plan.auto_fit_batch``: on
CUDA the largest ``data.eval_batch_size x 2^k``, at most ``plan.AUTO_FIT_BATCH_CAP`` and the training
set, whose fit planned holding every output factor's gradients fits ``plan.DEFAULT_MEMORY_BUDGET``
of the available memory; on the CPU ``data.eval_batch_size`` (a larger fit batch measured no faster
there); ``curvature.type=mc_fisher`` keeps ``data.eval_batch_size`` (its labels are drawn per batch,
so the batch would change the fit). Every other fit sums over the data: the batch changes its
result by float round-off only.
"""

from __future__ import annotations

import logging

import torch

from laplace_lab.config.schema import FIT_BATCH_AUTO
from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace, plan

log = logging.getLogger(__name__)


def fit_batch_size(value: int | str | None, datamodule: LabDataModule, la: Laplace,
                   device: torch.device | None = None) -> tuple[int | None, str]:
    """``(batch, reason)``: the fit loader's ``batch_size`` for ``curvature.fit_batch_size=value``
    (``None``: ``data.eval_batch_size``) and, for ``auto``, how it was chosen (``''`` otherwise) for
    ``la`` fitted on ``device`` (default: ``la``'s); an ``auto`` choice is logged with its reason."""
    if value != FIT_BATCH_AUTO:
        return value, ""
    device = torch.device(device or la.device)
    base = datamodule.eval_batch_size
    X = None  # the CPU chooses without looking at the data
    if device.type in plan.BUDGET_DEVICES:
        with torch.random.fork_rng(devices=[]):  # a loader's iterator draws its base seed
            X, _ = next(iter(datamodule.train_eval_dataloader()))
        X = X.to(la.device)
    cap = min(plan.AUTO_FIT_BATCH_CAP, len(datamodule.train_set))
    batch, reason = plan.auto_fit_batch(la, X, base, cap, plan.DEFAULT_MEMORY_BUDGET, device)
    log.info("Laplace fit_batch_size=auto: %d (%s)", batch, reason)
    return batch, reason
