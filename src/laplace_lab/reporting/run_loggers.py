"""Loggers of a run: ``logger.csv`` and ``logger.wandb`` (offline by default), each the class its
``_target_`` names, where enabled. Under Lightning's Trainer they are Lightning loggers; for the
plain loop (``plain=True``) they are ``CSVMetricsLogger`` (the same file, without importing
Lightning) and ``wandb_run.PlainWandbLogger`` (the same wandb run). ``logger.wandb.mode=disabled``
(e.g. ``WANDB_MODE=disabled``, which the test suite sets) builds no wandb logger at all, like
``logger.wandb.enabled=false``.

The wandb run is grouped by ``logger.wandb.group`` (the experiment name), typed by ``job_type``
and tagged from the config; its config is the flattened run config (``optimizer.lr``, ...); in a
multirun it is named after the job's overrides. Before it closes, the reliability table the
evaluation wrote becomes a line-plot panel (``charts/reliability``) so runs can be overlaid.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from laplace_lab.config.schema import RunConfig, constructor_arguments
from laplace_lab.io import quiet_logs
from laplace_lab.io.wandb_run import PlainWandbLogger, is_wandb_logger
from laplace_lab.reporting.csv_metrics import CSVMetricsLogger

log = logging.getLogger(__name__)
WANDB_MODES = ("offline", "online", "disabled")
CSV_NAME = "csv"  # csv/metrics.csv in the run folder (Lightning's CSVLogger with version "")


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
    """The enabled loggers of ``logger.*``, CSV first: each node's ``_target_`` built from its
    arguments (``schema.constructor_arguments``) and the run's: the CSV file ``output_dir/csv/metrics.csv``,
    the wandb run in ``output_dir/wandb`` with the flattened config. ``plain``: for the plain loop (no
    Lightning): ``CSVMetricsLogger`` writes the same file, ``PlainWandbLogger`` the same wandb run."""
    csv, wandb = run.logger.csv, run.logger.wandb
    if wandb.enabled and wandb.mode not in WANDB_MODES:
        raise ValueError(f"logger.wandb.mode={wandb.mode!r} is not supported; allowed: {list(WANDB_MODES)}")
    from hydra.utils import get_class

    loggers: list = []
    if csv.enabled:
        loggers.append(CSVMetricsLogger(output_dir, CSV_NAME) if plain else get_class(csv._target_)(
            save_dir=str(output_dir), **constructor_arguments(csv), name=CSV_NAME, version=""))
    if wandb.enabled and wandb.mode != "disabled":
        init = {**constructor_arguments(wandb), "tags": list(wandb.tags), "name": _multirun_job_name(),
                "config": flatten_config(run.raw)}
        if plain:
            loggers.append(PlainWandbLogger(str(output_dir), **init))
        else:
            loggers.append(get_class(wandb._target_)(save_dir=str(output_dir), **init))
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
