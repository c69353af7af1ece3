"""The end-of-multirun table: ``SweepTable`` is the ``aggregator`` that the ``SweepSummary`` callback
is given (``conf/train.yaml``: ``hydra.callbacks.sweep_summary.aggregator``), so the sweep machinery
(``laplace_lab.sweeps``) never imports reporting.

The ``aggregate`` option (``{name, metrics, group_by, seed_keys, results_dir, figures,
model_selection}``) is checked by ``validate_aggregate`` before any job runs, and written by
``tables.aggregate_sweep`` when the multirun ends; ``dashboard`` then writes the sweep's HTML page
(``laplace_lab.reporting.dashboard``), aggregated or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laplace_lab.io.names import check_name, inside
from laplace_lab.reporting.model_selection import validate_spec

AGGREGATE_KEYS = ("name", "metrics", "group_by", "seed_keys", "results_dir", "figures", "model_selection")


def validate_aggregate(aggregate: Any) -> dict[str, Any] | None:
    """The ``aggregate`` option (a mapping) as a plain dict (or None); unknown keys raise a ValueError."""
    if aggregate is None:
        return None
    spec = dict(aggregate)
    unknown = sorted(set(spec) - set(AGGREGATE_KEYS))
    if unknown:
        raise ValueError(f"aggregate has unknown keys {unknown}; "
                         f"allowed: {list(AGGREGATE_KEYS)}")
    if not spec.get("name"):
        raise ValueError("aggregate.name is required (the results/<name>.md table)")
    check_name(spec["name"], "aggregate.name")  # checked before any job runs; tables.aggregate again
    if spec.get("results_dir") is not None:
        inside(spec["results_dir"], ".", "aggregate.results_dir")  # below the sweep folder
    if spec.get("model_selection") is not None:
        validate_spec(spec["model_selection"])
    return spec


class SweepTable:
    """``validate(aggregate)`` at the start of a multirun, ``write(...)`` and ``dashboard(...)`` at its end."""

    def validate(self, aggregate: Any) -> dict[str, Any] | None:
        return validate_aggregate(aggregate)

    def write(self, sweep_dir: str | Path, spec: dict[str, Any], launch_id: str | None,
              preset: str | None) -> list[Path]:
        """The table of launch ``launch_id``'s jobs (``tables.aggregate_sweep``); the written paths."""
        from laplace_lab.reporting import tables  # (pandas-free, but not needed before the end)

        return tables.aggregate_sweep(sweep_dir, spec, launch_id=launch_id, preset=preset)

    def dashboard(self, sweep_dir: str | Path) -> Path:
        """The sweep's self-contained ``dashboard.html`` (``dashboard.build``, after ``summary.json``); its path."""
        from laplace_lab.reporting import dashboard

        return dashboard.build(sweep_dir)
