"""The memory and time plan of a run's Laplace (``laplace.plan``) before training: one log line for
the configured structure, a refusal when it cannot fit, and the table of every (subset, structure)
that ``python -m laplace_lab.plan`` prints.

The plan reads the network's shapes from one forward of a training input and times one fit batch
(``plan.probe_fit_time``) at the network's current weights (before training: its initial ones; the
memory and time of a fit do not depend on the weights' values).
"""

from __future__ import annotations

import logging

import torch

from laplace_lab.config.schema import FIT_BATCH_AUTO, RunConfig
from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace, plan
from laplace_lab.laplace.output_factors import n_output_factors
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.training.fit_batch import fit_batch_size
from laplace_lab.training.plain_loop import resolve_device

log = logging.getLogger(__name__)


def _fit_batch(run: RunConfig, datamodule: LabDataModule, la: Laplace, device: torch.device):
    """``(X, y, n_batches)``: the first fit batch of the run's Laplace ``la`` fitted on ``device``
    and the number of batches (``curvature.fit_batch_size``, ``training.fit_batch``)."""
    loader = datamodule.train_eval_dataloader(batch_size=fit_batch_size(run.curvature.fit_batch_size, datamodule,
                                                                        la, device)[0])
    X, y = next(iter(loader))
    return X, y, len(loader)


def plan_table(run: RunConfig, datamodule: LabDataModule, model: torch.nn.Module, likelihood: str,
               probe_time: bool = True) -> tuple[list[plan.FitPlan], int, float]:
    """Every (subset, structure) supporting the run's curvature type with its memory plan (the
    configured one with its ``structure_options``) and, where it fits ``memory_budget`` of the
    available memory and ``probe_time``, its predicted fit time. Returns ``(rows, batch, limit)``."""
    with torch.random.fork_rng(devices=[]):
        return _plan_table(run, datamodule, model, likelihood, probe_time)


def _plan_table(run, datamodule, model, likelihood, probe_time):
    c = run.curvature
    device = next(model.parameters()).device
    la = Laplace(model, likelihood, memory_budget=plan.DEFAULT_MEMORY_BUDGET, **c.laplace_kwargs())
    X, y, n_batches = _fit_batch(run, datamodule, la, device)
    X, y = X.to(device), y.to(device)
    probe = plan.probe_model(model, X)
    K = n_output_factors(likelihood, c.type, probe["n_outputs"], int(c.n_mc_samples))
    limit = plan.DEFAULT_MEMORY_BUDGET * plan.available_memory(device)
    rows = plan.alternatives(model, probe, X.shape[0], K, c.type, device_type=device.type, limit=limit)
    for row in rows:
        if (row.subset, row.structure) == (c.subset_of_weights, c.hessian_structure) and c.structure_options:
            shape = plan.shape_of(model, probe, row.subset)
            row.memory = plan.fit_plan(STRUCTURES[row.structure], shape, X.shape[0], K, c.structure_options,
                                       device.type, limit)
    if probe_time:
        for row in rows:
            if row.memory is not None and row.memory.fit <= limit:
                opts = c.structure_options if (row.subset, row.structure) == (c.subset_of_weights,
                                                                              c.hessian_structure) else {}
                row.seconds = plan.probe_fit_time(
                    lambda row=row, opts=opts: Laplace(model, likelihood, subset_of_weights=row.subset,
                                                       hessian_structure=row.structure, curvature=c.type,
                                                       n_mc_samples=int(c.n_mc_samples), memory_budget=None,
                                                       structure_options=dict(opts)),
                    X, y, n_batches)
    return rows, X.shape[0], limit


def format_table(rows: list[plan.FitPlan], limit: float) -> str:
    """A markdown table: structure, subset, parameters, fit peak, state, predictive per input, time."""
    out = ["| structure | subset | parameters | fit peak | kept after fit | predictive per input | fit time | fits |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.memory
        if m is None:
            out.append(f"| {r.structure} | {r.subset} | {r.n_params:,} | no plan declared | | | | ? |")
            continue
        secs = "-" if r.seconds is None else f"{r.seconds:.2f} s"
        out.append(f"| {r.structure} | {r.subset} | {r.n_params:,} | {plan.human(m.fit)} | {plan.human(m.state)} | "
                   f"{plan.human(m.predict_per_input)} | {secs} | {'yes' if m.fit <= limit else 'NO'} |")
    return "\n".join(out)


def check_run_laplace(run: RunConfig, datamodule: LabDataModule, model: torch.nn.Module, likelihood: str) -> None:
    """Log the plan of the run's Laplace in one line; ``plan.MemoryPlanError`` before training when
    its fit cannot fit ``memory_budget`` of the available memory. The global random state is left as
    it was (the probe's loader and an ``mc_fisher`` probe would draw from it)."""
    with torch.random.fork_rng(devices=[]):
        _check_run_laplace(run, datamodule, model, likelihood)


def _check_run_laplace(run, datamodule, model, likelihood) -> None:
    c = run.curvature
    device = next(model.parameters()).device

    def make(budget=None):
        return Laplace(model, likelihood, memory_budget=budget, **c.laplace_kwargs())

    la = make(plan.DEFAULT_MEMORY_BUDGET)
    target = resolve_device(run.trainer.accelerator)  # where the Laplace is fitted, after training
    X, y, n_batches = _fit_batch(run, datamodule, la, target)
    X, y = X.to(device), y.to(device)
    memory = plan.check_fit(la, X, la.memory_budget, target)  # raises MemoryPlanError, naming what fits
    if memory is None:
        log.info("Laplace plan: %s %s %s declares no memory plan", c.subset_of_weights, c.hessian_structure, c.type)
        return
    # the time probe runs where the network is now: on the fit's device only
    when = _seconds(plan.probe_fit_time(make, X, y, n_batches)) if target.type == device.type else \
        f"not probed (the network is on {device.type} before training)"
    log.info("Laplace plan: %s %s %s, %d batches of %d%s, output factors %s: fit peak ~%s (kept %s; %s available "
             "on %s), fit ~%s", c.subset_of_weights, c.hessian_structure, c.type, n_batches, X.shape[0],
             " (fit_batch_size=auto)" if c.fit_batch_size == FIT_BATCH_AUTO else "", _streaming(memory, target), plan.human(memory.fit),
             plan.human(memory.state), plan.human(plan.available_memory(target)), target, when)


def _streaming(memory: plan.MemoryPlan, device: torch.device) -> str:
    """How the capture backend will take the output factors' gradients, for the plan's line."""
    rule = "memory budget" if device.type in plan.BUDGET_DEVICES else "fixed size"
    return f"{'streamed' if memory.stream else 'held'} ({rule} rule)"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 600 else f"{s / 60:.0f} min" if s < 36000 else f"{s / 3600:.1f} h"


__all__ = ["plan_table", "format_table", "check_run_laplace"]
