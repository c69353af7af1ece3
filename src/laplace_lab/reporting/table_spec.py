"""What ``tables.aggregate`` is asked for, in two typed groups: ``TableSpec`` (what the table shows:
the preset's ``aggregate`` block less its name and folder) and ``Admission`` (which jobs it takes and
which provenance problems it tolerates). Both are frozen; ``None`` means "the default" that
``aggregate`` states (derived from the runs, or ``tables.DEFAULT_SEED_KEYS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TableSpec:
    """The columns, rows and extra sections of a table.

    Args:
        metrics: metric keys (columns; default: every metric but ``time/*`` of the runs).
        group_by: the keys whose values make a row (default: the overrides less the seed keys).
        seed_keys: replicate keys averaged over within a row (default ``tables.DEFAULT_SEED_KEYS``).
        figures: names of ``figures/<fig>.png`` to copy from each row's first seed.
        model_selection: a ``laplace_lab.reporting.model_selection`` spec (a ranking section).
        absent_metrics: what a metric that no run has does: ``"error"`` (a ValueError naming the
            metrics the runs have) or ``"omit"`` (left out and named under the table).
    """

    metrics: Sequence[str] | None = None
    group_by: Sequence[str] | None = None
    seed_keys: Sequence[str] | None = None
    figures: Sequence[str] | None = None
    model_selection: dict[str, Any] | None = None
    absent_metrics: str = "error"


@dataclass(frozen=True)
class Admission:
    """Which finished jobs a table takes, and which provenance problems it writes anyway.

    Args:
        launch_id: only the jobs of that launch (``None``: every finished job of the folders).
        allow_mixed: write although the jobs are not from one clean commit containing the preset
            (the table then names the commit of every row; ``--allow-mixed``).
        allow_mixed_launches: write although the jobs were launched by different commands
            (``--allow-mixed-launches``).
        allow_smaller: with ``commit_results``, replace a committed table by one with fewer jobs,
            seeds or rows (``--allow-smaller``; ``table_commit.check_replacement``).
    """

    launch_id: str | None = None
    allow_mixed: bool = False
    allow_mixed_launches: bool = False
    allow_smaller: bool = False
