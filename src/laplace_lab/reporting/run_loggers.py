"""Loggers of a run: CSV always, wandb (offline by default) when enabled. Under Lightning's Trainer
they are Lightning loggers; for the plain loop (``plain=True``) they are ``CSVMetricsLogger`` (the
same file, without importing Lightning) and ``wandb_run.PlainWandbLogger`` (the same wandb run).
``logger.wandb.mode=disabled`` (e.g. ``WANDB_MODE=disabled``, which the test suite sets) builds no
wandb logger at all, like ``logger.wandb.enabled=false``.

The wandb run is grouped by ``logger.wandb.group`` (the experiment name), typed by ``job_type``
and tagged from the config; its config is the flattened run config (``optimizer.lr``, ...); in a
multirun it is named after the job's overrides. Before it closes, the reliability table the
evaluation wrote becomes a line-plot panel (``charts/reliability``) so runs can be overlaid.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from laplace_lab.config.schema import RunConfig
from laplace_lab.io import quiet_logs
from laplace_lab.reporting.csv_metrics import CSVMetricsLogger
from laplace_lab.io.wandb_run import PlainWandbLogger, is_wandb_logger

log = logging.getLogger(__name__)
WANDB_MODES = ("offline", "online", "disabled")


def flatten_config(data: dict, sep: str = ".") -> dict[str, Any]:
    """``{"optimizer": {"lr": 1e-3}}`` -> ``{"optimizer.lr": 1e-3}`` (lists kept whole, {} -> None)."""
    flat: dict[str, Any] = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                visit(value, f"{prefix}{sep}{key}" if prefix else str(key))
        else:
            flat[prefix] = None if node == {} else node

    visit(data, "")
    return flat


def multirun_overrides() -> list[str] | None:
    """The task overrides of this run when it is a job of a Hydra multirun (None otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:  # pragma: no cover
        return None
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return list(HydraConfig.get().overrides.task)
    return None


def swept_values() -> list[str]:
    """A multirun job's ``key=value`` overrides as its folder name has them (normalised, run-only keys
    left out: ``sweeps.run_only.normalized_overrides``); ``[]`` outside a multirun."""
    overrides = multirun_overrides()
    if not overrides:
        return []
    from laplace_lab.sweeps.run_only import normalized_overrides

    return normalized_overrides(overrides)


def _multirun_job_name() -> str | None:
    """The job's folder name (``sweeps.run_only.job_dirname``) when this run is a job of a Hydra multirun."""
    overrides = multirun_overrides()
    if overrides is None:
        return None
    from laplace_lab.sweeps.run_only import job_dirname

    return job_dirname(overrides)


def build_loggers(run: RunConfig, output_dir: Path, plain: bool = False) -> list:
    """CSV logger in ``output_dir/csv``; wandb run in ``output_dir/wandb`` with the flattened config.
    ``plain``: the plain loop's loggers (no Lightning)."""
    loggers: list = []
    wandb = run.logger.wandb
    if wandb.enabled and wandb.mode not in WANDB_MODES:
        raise ValueError(f"logger.wandb.mode={wandb.mode!r} is not supported; allowed: {list(WANDB_MODES)}")
    if run.logger.csv:
        if plain:
            loggers.append(CSVMetricsLogger(output_dir, "csv"))
        else:
            from pytorch_lightning.loggers import CSVLogger

            loggers.append(CSVLogger(save_dir=str(output_dir), name="csv", version=""))
    if wandb.enabled and wandb.mode != "disabled":
        init = dict(project=wandb.project, entity=wandb.entity, group=wandb.group, job_type=wandb.job_type,
                    tags=list(wandb.tags), name=_multirun_job_name(), mode=wandb.mode,
                    config=flatten_config(run.raw))
        if plain:
            loggers.append(PlainWandbLogger(str(output_dir), **init))
        else:
            from pytorch_lightning.loggers import WandbLogger

            loggers.append(WandbLogger(save_dir=str(output_dir), **init))
            quiet_logs.drop_wandb_anonymous(loggers[-1])
    return loggers


def log_reliability_chart(logger, table_csv: Path) -> None:
    """A wandb line plot (confidence -> accuracy, one line per predictor) of the reliability table
    (``logger``: a Lightning ``WandbLogger``)."""
    import pandas as pd
    import wandb

    df = pd.read_csv(table_csv)
    if "count" in df:
        df = df[df["count"] > 0]
    columns = [c for c in ("predictor", "confidence", "accuracy", "count", "bin_center") if c in df]
    table = wandb.Table(dataframe=df[columns].reset_index(drop=True))
    chart = wandb.plot.line(table, "confidence", "accuracy", stroke="predictor" if "predictor" in df else None,
                            title="Reliability (accuracy vs confidence)")
    logger.experiment.log({"charts/reliability": chart})


def finish_loggers(loggers: list) -> None:
    """Flush every logger and close the wandb run, so the next run in this process starts a new one."""
    for logger in loggers:
        if is_wandb_logger(logger):
            table_csv = Path(logger.save_dir or ".") / "tables" / "reliability.csv"
            if table_csv.is_file():
                try:
                    log_reliability_chart(logger, table_csv)
                except Exception as err:  # noqa: BLE001 - a chart must never fail the run
                    log.warning("wandb reliability chart not logged: %s", err)
        logger.finalize("success")
        if is_wandb_logger(logger):
            logger.experiment.finish()
