"""``CSVMetricsLogger``: the run's ``csv/metrics.csv`` without Lightning (the plain training loop).

The file is the one Lightning's ``CSVLogger(save_dir, name="csv", version="")`` writes: one row
per ``log_metrics`` call with its ``step``, the header the sorted union of all keys (rewritten when
a new key appears), empty cells for keys a row lacks, values as Python writes floats.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class CSVMetricsLogger:
    """Rows of metrics in ``<save_dir>/<name>/metrics.csv`` (Lightning's CSV layout, above)."""

    def __init__(self, save_dir: str | Path, name: str = "csv"):
        self.save_dir, self.name = str(save_dir), name
        self.log_dir = Path(save_dir) / name
        self.path = self.log_dir / "metrics.csv"
        self.rows: list[dict[str, Any]] = []
        self.keys: list[str] = []
        if self.log_dir.exists() and any(self.log_dir.iterdir()):
            log.warning("Experiment logs directory %s exists and is not empty; its metrics.csv is replaced", self.log_dir)
            self.path.unlink(missing_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Queue one row (tensors as ``.item()``); ``step`` defaults to the row count."""
        row = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
        row["step"] = len(self.rows) if step is None else step
        self.rows.append(row)

    def save(self) -> None:
        """Append the queued rows (rewriting the file under a new header if new keys appeared)."""
        if not self.rows:
            return
        new = set().union(*self.rows) - set(self.keys)
        self.keys = sorted([*self.keys, *new])
        exists = self.path.is_file()
        if new and exists:
            with self.path.open(newline="") as file:
                old = list(csv.DictReader(file))
            with self.path.open("w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.keys)
                writer.writeheader()
                writer.writerows(old)
        with self.path.open("a" if exists else "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.rows)
        self.rows = []

    def finalize(self, status: str) -> None:
        self.save()
