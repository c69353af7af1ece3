"""Third-party noise filtered out of a run's output, listed in one place.

``install()`` (called once at start-up by ``train.main``; idempotent) hides the lines below, each
known to be harmless for laplace-lab's runs, so that what remains on screen is the project's own
lines and the warnings that may matter. Anything not listed here still shows.

- ``WARNINGS``: Python warnings (``warnings.filterwarnings``), by message.
- ``LOG_LINES``: log records of third-party loggers (a ``logging.Filter`` on each), by message.
- wandb's "anonymous setting" warning: Lightning's ``WandbLogger`` always passes
  ``anonymous=None`` to ``wandb.init``, which wandb >= 0.19 warns about even when unset;
  ``drop_wandb_anonymous`` removes the key before the run starts.
"""

from __future__ import annotations

import logging
import re
import warnings

# (message regex, why it is harmless here). Matched at the start of the warning's message.
WARNINGS: tuple[tuple[str, str], ...] = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated",
     "torch deprecation hit inside Lightning's own code (pytorch_lightning/utilities/_pytree.py)"),
    (r"The number of training batches \(\d+\) is smaller than the logging interval",
     "small data sets: the per-epoch means are logged anyway"),
    (r".*does not have many workers",
     "in-memory and small image sets load in the main process on purpose (data.num_workers=0)"),
    (r"Total length of `\w+` across ranks is zero",
     "the empty validation loader of runs that train on every row (map_grid_refit, data.n_val=0)"),
    (r"\s*'hydra/(launcher|sweeper)/\w+' is validated against ConfigStore schema",
     "conf/hydra/{launcher,sweeper}/*.yaml share the plugins' schema names on purpose, so Hydra "
     "validates them"),
)

# logger name -> message regexes of its records to drop (INFO chatter and tips).
LOG_LINES: dict[str, tuple[str, ...]] = {
    "pytorch_lightning.utilities.rank_zero": (
        r"💡 Tip",                                   # advertising (litlogger, LitServe, ...)
        r"`Trainer\(limit_\w+=",                    # "... was configured so 100% of the batches ..."
        r"(GPU|TPU|HPU|IPU) available",              # the run logs its own "Devices:" line
        r"`Trainer\.fit` stopped: `max_epochs=",     # the run logs its own "MAP training:" line
    ),
    "lightning_fabric.utilities.seed": (r"Seed set to",),  # the seed is in config_resolved.yaml
    "lightning.fabric.utilities.seed": (r"Seed set to",),
}


class _DropMatching(logging.Filter):
    """Drop records whose message matches one of ``patterns``."""

    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def install() -> None:
    """Register the warning filters and the log-record filters. Idempotent: ``warnings`` keeps one
    copy of a filter, and a logger gets its ``_DropMatching`` once."""
    for pattern, _why in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name, patterns in LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMatching) for f in logger.filters):
            logger.addFilter(_DropMatching(patterns))


def drop_wandb_anonymous(wandb_logger) -> None:
    """Remove ``anonymous`` from a Lightning ``WandbLogger``'s pending ``wandb.init`` arguments
    (see the module docstring); a logger without them is left as it is."""
    init_kwargs = getattr(wandb_logger, "_wandb_init", None)
    if isinstance(init_kwargs, dict) and init_kwargs.get("anonymous") is None:
        init_kwargs.pop("anonymous", None)
