"""Loggers of a run: ``logger.csv`` and ``logger.wandb`` (offline by default), each the class its
``_target_`` names, where enabled. Under Lightning's Trainer they are Lightning loggers; for the
plain loop (``plain=True``) the CSV one is ``CSVMetricsLogger`` (the same file, without importing
Lightning).

The wandb run is grouped by ``logger.wandb.group`` (the experiment name), typed by ``job_type``
and tagged from the config; its config is the flattened run config (``optimizer.lr``, ...); in a
multirun it is named after the job's overrides. Before it closes, the reliability table the
evaluation wrote becomes a line-plot panel (``charts/reliability``) so runs can be overlaid.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from laplace_lab.config.schema import RunConfig, constructor_arguments
from laplace_lab.io import quiet_logs
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


def _multirun_job_name() -> str | None:
    """The job's folder name (``sweeps.run_only.job_dirname``) when this run is a job of a Hydra multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:  # pragma: no cover
        return None
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        from laplace_lab.sweeps.run_only import job_dirname

        return job_dirname(HydraConfig.get().overrides.task)
    return None


def build_loggers(run: RunConfig, output_dir: Path, plain: bool = False) -> list:
    """The enabled loggers of ``logger.*``, CSV first: each node's ``_target_`` built from its
    arguments (``schema.constructor_arguments``) and the run's: the CSV file ``output_dir/csv/metrics.csv``,
    the wandb run in ``output_dir/wandb`` with the flattened config. ``plain``: for the plain loop (no
    Lightning): ``CSVMetricsLogger`` writes the same file; a wandb logger is an error."""
    csv, wandb = run.logger.csv, run.logger.wandb
    if plain:
        if wandb.enabled:
            raise ValueError("logger.wandb.enabled=true needs trainer.loop in ['auto', 'lightning']")
        return [CSVMetricsLogger(output_dir, CSV_NAME)] if csv.enabled else []
    if wandb.enabled and wandb.mode not in WANDB_MODES:
        raise ValueError(f"logger.wandb.mode={wandb.mode!r} is not supported; allowed: {list(WANDB_MODES)}")
    from hydra.utils import get_class

    loggers = []
    for node in (n for n in (csv, wandb) if n.enabled):
        own = ({"name": CSV_NAME, "version": ""} if node is csv else
               {"name": _multirun_job_name(), "config": flatten_config(run.raw)})
        loggers.append(get_class(node._target_)(save_dir=str(output_dir), **constructor_arguments(node), **own))
    if wandb.enabled:
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


def _is_wandb(logger) -> bool:
    lightning_loggers = sys.modules.get("pytorch_lightning.loggers")  # not imported: no WandbLogger exists
    return lightning_loggers is not None and isinstance(logger, lightning_loggers.WandbLogger)


def finish_loggers(loggers: list) -> None:
    """Flush every logger and close the wandb run, so the next run in this process starts a new one."""
    for logger in loggers:
        if _is_wandb(logger):
            table_csv = Path(logger.save_dir or ".") / "tables" / "reliability.csv"
            if table_csv.is_file():
                try:
                    log_reliability_chart(logger, table_csv)
                except Exception as err:  # noqa: BLE001 - a chart must never fail the run
                    log.warning("wandb reliability chart not logged: %s", err)
        logger.finalize("success")
        if _is_wandb(logger):
            logger.experiment.finish()
