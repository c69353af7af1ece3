"""A run's W&B run without Lightning, and the one test for "is this logger a W&B run".

``PlainWandbLogger`` is what the plain training loop (``training.plain_loop``) logs to when
``logger.wandb.enabled=true``: the same ``wandb.init`` arguments, the same x axis
(``trainer/global_step``, as Lightning's ``WandbLogger`` defines it) and the same ``experiment``
(the ``wandb`` run, started on first use) as Lightning's logger, so the evaluation's figures and
tables (``evaluation.report``) and the reliability chart (``reporting.run_loggers``) reach it the
same way. With it, a run on in-memory data keeps the plain loop when it logs to W&B.

Where a toy run's W&B time went: with Lightning's logger the run also took Lightning's loop
(its import and per-epoch overhead), which cost more than wandb itself (its import and the start
of its service process, a few seconds); wandb's settings that switch off the system-metrics
sampler, metadata probe and console capture made no measurable difference to a run. Importing
this module does not import wandb.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

STEP_KEY = "trainer/global_step"  # Lightning's WandbLogger's x axis


class PlainWandbLogger:
    """Metrics rows to a wandb run in ``<save_dir>/wandb`` (``init_kwargs``: ``wandb.init``'s, less ``dir``).

    The interface the plain loop and the reporter use: ``log_metrics(metrics, step)``, ``save()``,
    ``finalize(status)``, ``save_dir`` and ``experiment``."""

    def __init__(self, save_dir: str, **init_kwargs: Any):
        self.save_dir = str(save_dir)
        self._init = {**init_kwargs, "dir": self.save_dir}
        self._experiment = None

    @property
    def experiment(self):
        """The wandb run, started by the first call (Lightning's ``WandbLogger`` starts it the same way)."""
        if self._experiment is None:
            import wandb

            self._experiment = wandb.init(**self._init)
            self._experiment.define_metric(STEP_KEY)
            self._experiment.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One ``wandb.log`` call (tensors as ``.item()``), with ``trainer/global_step`` when ``step`` is given."""
        row = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
        if step is not None:
            row[STEP_KEY] = step
        self.experiment.log(row)

    def save(self) -> None:
        """Nothing to flush: wandb writes its own files."""

    def finalize(self, status: str) -> None:
        """Nothing to close here: ``run_loggers.finish_loggers`` finishes the run."""


def is_wandb_logger(logger) -> bool:
    """Whether ``logger`` is a W&B run: Lightning's ``WandbLogger`` (when Lightning is loaded) or ours."""
    if isinstance(logger, PlainWandbLogger):
        return True
    lightning_loggers = sys.modules.get("pytorch_lightning.loggers")  # not imported: no WandbLogger exists
    return lightning_loggers is not None and isinstance(logger, lightning_loggers.WandbLogger)
