"""Numeric options that bound each other, and runs that would train nothing: checked on the typed
``RunConfig`` before any data is loaded (``validation.check_combinations`` calls ``check_interplay``).

Each option's own range is ``config.schema`` / ``config.values``; here two options together:

- ``marglik.lr_hyp_min <= marglik.lr_hyp`` (the cosine schedule decays the rate to its minimum;
  ``marglik.log_min < marglik.log_max`` is ``validation.check_laplace``'s), and the initial
  ``prior.prior_precision`` (and regression ``sigma_noise``) within ``exp([log_min, log_max])``, the
  clamp range of online marglik (else the first step silently moves them to its edge);
- ``lr_scheduler.eta_min <= optimizer.lr`` (a cosine schedule anneals *down* to ``eta_min``);
- online marglik: ``marglik.burnin`` / ``marglik.frequency`` leave at least one marglik epoch within
  ``trainer.max_epochs`` (else the hyperparameters are never learned, yet reported as tuned);
- a run trains its MAP: ``trainer.limit_train_batches`` and ``+trainer.max_steps`` are not 0 (else an
  untrained network would be evaluated as the MAP).

Each raises ``ValueError`` naming both options, their values and the allowed values.
"""

from __future__ import annotations

import math

from laplace_lab.config.schema import RunConfig
from laplace_lab.laplace.marglik_schedule import marglik_epochs


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def check_interplay(run: RunConfig) -> None:
    """Every check above, in the order of the module docstring."""
    check_marglik_ranges(run)
    check_lr_schedule(run)
    check_marglik_epochs(run)
    check_trains_something(run)


def check_marglik_ranges(run: RunConfig) -> None:
    m = run.marglik
    if not m.online:  # lr_hyp_min is an option of marglik=online only
        return
    _require(m.lr_hyp_min is None or m.lr_hyp_min <= m.lr_hyp,
             f"marglik.lr_hyp_min={m.lr_hyp_min} is above marglik.lr_hyp={m.lr_hyp} (the schedule decays lr_hyp "
             f"down to lr_hyp_min); allowed: marglik.lr_hyp_min null or in [0, {m.lr_hyp}]")
    values = {"prior.prior_precision": run.prior.prior_precision}
    if m.optimize_sigma and run.likelihood in ("auto", "regression"):
        values["sigma_noise"] = run.sigma_noise
    for key, value in values.items():
        _require(m.log_min <= math.log(value) <= m.log_max,
                 f"{key}={value} lies outside the clamp range of online marglik, exp(marglik.log_min={m.log_min}) to "
                 f"exp(marglik.log_max={m.log_max}); allowed: {key} in [{math.exp(m.log_min):.4g}, "
                 f"{math.exp(m.log_max):.4g}] (or widen marglik.log_min / log_max)")


def check_lr_schedule(run: RunConfig) -> None:
    sched, lr = run.lr_scheduler or {}, run.optimizer.get("lr")
    eta_min = sched.get("eta_min")
    if isinstance(eta_min, (int, float)) and isinstance(lr, (int, float)):
        _require(eta_min <= lr, f"lr_scheduler.eta_min={eta_min} is above optimizer.lr={lr} (the cosine schedule "
                                f"anneals the learning rate down to eta_min); allowed: lr_scheduler.eta_min in [0, {lr}]")


def check_marglik_epochs(run: RunConfig) -> None:
    m, epochs = run.marglik, run.trainer.max_epochs
    if not m.online or epochs is None:
        return
    _require(bool(marglik_epochs(epochs, m.burnin, m.frequency)),
             f"marglik.burnin={m.burnin} and marglik.frequency={m.frequency} leave no marglik epoch within "
             f"trainer.max_epochs={epochs}: the hyperparameters would never be learned; allowed: marglik.burnin <= "
             f"{epochs} (and marglik.frequency <= {epochs} with burnin=0)")


def check_trains_something(run: RunConfig) -> None:
    t = run.trainer
    _require(t.limit_train_batches != 0,
             "trainer.limit_train_batches=0 trains no batch: the untrained network would be evaluated as the MAP; "
             "allowed: a fraction in (0, 1] or a number of batches >= 1")
    steps = t.extra.get("max_steps", -1)
    _require(steps is None or steps != 0,
             "trainer.max_steps=0 trains no step: the untrained network would be evaluated as the MAP; allowed: "
             "-1 (no limit) or a number of steps >= 1")
