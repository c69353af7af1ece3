"""Checks of a composed config that must fail before any data is loaded or any training runs.

Each check raises ``ValueError`` with the option's name and the allowed values.
"""

from __future__ import annotations

from omegaconf import DictConfig

LIKELIHOOD_CHOICES = ("auto", "classification", "regression", "heteroscedastic_regression")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate_config(cfg: DictConfig) -> None:
    """Reject invalid option values and combinations of the root config and its groups."""
    _require(cfg.likelihood in LIKELIHOOD_CHOICES,
             f"likelihood={cfg.likelihood!r} is not supported; allowed: {list(LIKELIHOOD_CHOICES)}")
    _require(isinstance(cfg.seed, int) and cfg.seed >= 0, f"seed must be a non-negative integer; got {cfg.seed!r}")
    for name in ("prior_precision", "sigma_noise", "temperature"):
        value = cfg.get(name)
        _require(isinstance(value, (int, float)) and value > 0, f"{name} must be a positive number; got {value!r}")
    weight_decay = cfg.optimizer.get("weight_decay", 0.0)
    _require(
        not weight_decay,
        f"optimizer.weight_decay={weight_decay} is not allowed; allowed: 0. The Gaussian prior is the "
        "weight decay: set prior_precision (delta = weight_decay * N) instead.",
    )
    _require(cfg.trainer.max_epochs is None or cfg.trainer.max_epochs >= 1,
             f"trainer.max_epochs must be >= 1; got {cfg.trainer.max_epochs}")
