"""When the online marginal likelihood steps (Immer et al. 2021, Algorithm 1): after every ``F``-th
epoch from the burn-in ``B`` on. Pure functions of 1-based epoch numbers, shared by the training
callbacks and the config checks (which refuse a schedule with no marglik epoch)."""

from __future__ import annotations


def is_marglik_epoch(epoch: int, max_epochs: int, burnin: int, frequency: int) -> bool:
    """Whether a marglik step runs after the 1-based ``epoch``: ``1 <= epoch <= max_epochs``,
    ``epoch >= burnin`` and ``(epoch - burnin) % F == 0``."""
    return max(burnin, 1) <= epoch <= max_epochs and (epoch - burnin) % frequency == 0


def marglik_epochs(max_epochs: int, burnin: int, frequency: int) -> list[int]:
    """1-based epochs after which a marglik step runs (``is_marglik_epoch``)."""
    return [e for e in range(1, max_epochs + 1) if is_marglik_epoch(e, max_epochs, burnin, frequency)]
