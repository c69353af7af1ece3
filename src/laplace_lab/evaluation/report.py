"""Send evaluation results to the run's PyTorch Lightning loggers and to the output directory.

``Reporter(out_dir, loggers)`` collects scalars, figures and tables and:
- always writes ``<out_dir>/figures/<name>.png``, ``<out_dir>/tables/<name>.csv`` (as they come)
  and, on ``finalize()``, ``<out_dir>/eval_metrics.json`` (the flat metric dict),
  ``<out_dir>/eval_metrics.csv`` (columns ``key, value``) and ``<out_dir>/eval_report.json``
  (config, skipped sections with reasons, figure and table names, wall time);
- on ``finalize()``, logs the scalars with ``logger.log_metrics`` to every Lightning logger
  (``CSVLogger``, ``WandbLogger``, TensorBoard, ...; ``save()`` is called so the CSV is flushed),
  and for a W&B logger (Lightning's ``WandbLogger`` or ``io.wandb_run.PlainWandbLogger``)
  also the figures as ``wandb.Image`` under ``figures/<name>`` and the tables as ``wandb.Table``
  under ``tables/<name>``, in one ``wandb.log`` call.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from laplace_lab.io.wandb_run import is_wandb_logger

log = logging.getLogger(__name__)


def fill_balanced(text: str, width: int) -> str:
    """``text`` on as few lines of at most ``width`` characters as ``textwrap`` needs, the lines about
    equally long (no last line of one short word, e.g. "(MC)"), words and hyphenated names kept whole."""
    n_lines = len(textwrap.wrap(text, width, break_on_hyphens=False)) or 1
    for w in range(-(-len(text) // n_lines), width + 1):
        lines = textwrap.wrap(text, w, break_on_hyphens=False)
        if len(lines) <= n_lines:
            return "\n".join(lines)
    return textwrap.fill(text, width, break_on_hyphens=False)


class Reporter:
    def __init__(self, out_dir: str | Path, loggers: Any = None, step: int | None = None, label: str = ""):
        self.label = label  # the data set and predictors, above every figure's own title
        self.out_dir = Path(out_dir)
        (self.out_dir / "figures").mkdir(parents=True, exist_ok=True)
        (self.out_dir / "tables").mkdir(parents=True, exist_ok=True)
        if loggers is None:
            loggers = []
        elif not isinstance(loggers, (list, tuple)):
            loggers = [loggers]
        self.loggers = list(loggers)
        self.step = step
        self.metrics: dict[str, float] = {}
        self.figures: dict[str, Path] = {}
        self.tables: dict[str, pd.DataFrame] = {}
        self.skipped: dict[str, str] = {}
        self._t0 = time.time()

    # ------------------------------------------------------------------ collect
    def add_metrics(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if k in self.metrics:
                raise KeyError(f"metric {k!r} reported twice")
            self.metrics[k] = float(v)

    def add_figure(self, name: str, fig: Figure) -> Path:
        if self.label:  # every figure names the run's data set and Laplace predictive
            own = fig._suptitle.get_text() if fig._suptitle is not None else ""
            width = max(int(fig.get_figwidth() * 11), 30)
            label = "\n".join(fill_balanced(part, width) for part in self.label.split("; "))
            fig.suptitle(f"{label}\n{own}" if own else label, fontsize="medium")
        path = self.out_dir / "figures" / f"{name}.png"
        fig.savefig(path, dpi=110)
        self.figures[name] = path
        return path

    def add_table(self, name: str, df: pd.DataFrame) -> Path:
        path = self.out_dir / "tables" / f"{name}.csv"
        df.to_csv(path, index=False)
        self.tables[name] = df
        return path

    def skip(self, section: str, reason: str, warn: bool = True) -> None:
        """Record that ``section`` did not run and why (a warning unless it was switched off)."""
        log.log(logging.WARNING if warn else logging.INFO, "evaluation: skipping %s: %s", section, reason)
        self.skipped[section] = reason

    # ------------------------------------------------------------------ flush
    def finalize(self, config: dict | None = None) -> dict[str, float]:
        """Write the files and log to every logger; returns the metrics."""
        metrics = dict(sorted(self.metrics.items()))
        with open(self.out_dir / "eval_metrics.json", "w") as f:
            json.dump({k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}, f, indent=1)
        with open(self.out_dir / "eval_metrics.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["key", "value"])
            w.writerows(metrics.items())
        report = {
            "config": config,
            "skipped": self.skipped,
            "figures": sorted(self.figures),
            "tables": sorted(self.tables),
            "n_metrics": len(metrics),
            "wall_time_s": round(time.time() - self._t0, 2),
        }
        with open(self.out_dir / "eval_report.json", "w") as f:
            json.dump(report, f, indent=1)
        for lg in self.loggers:
            if is_wandb_logger(lg):
                self._log_wandb(lg, metrics)
            else:
                lg.log_metrics(metrics, step=self.step)
                if hasattr(lg, "save"):
                    lg.save()
        return metrics

    def _log_wandb(self, lg, metrics: dict[str, float]) -> None:
        import wandb

        payload: dict[str, Any] = dict(metrics)
        for name, path in self.figures.items():
            payload[f"figures/{name}"] = wandb.Image(str(path))
        for name, df in self.tables.items():
            payload[f"tables/{name}"] = wandb.Table(dataframe=df.reset_index(drop=True))
        if self.step is not None:
            payload["trainer/global_step"] = self.step
        lg.experiment.log(payload)
