"""``tables --commit-results`` never silently shrinks a committed table.

Before ``results/<name>.*`` is replaced, the committed table's jobs (rows of ``<name>.jobs.csv``),
seeds and rows (``<name>.csv``: its group-by columns, ``n`` and ``seeds``) are compared with the new
one's: fewer jobs, a seed or a row that the new table lacks, or rows grouped by other keys refuse
the write (``ShrinkingTable``) unless ``allow_smaller`` (``--allow-smaller``). A one-seed test launch
followed by the README's commit command overwrote the 5-seed, 3-method ``results/redux_mnist.*``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from laplace_lab.io.atomic import finish_interrupted


class ShrinkingTable(ValueError):
    """The new table has fewer jobs, seeds or rows than the committed one it would replace."""


@dataclass(frozen=True)
class TableShape:
    """What a table covers: its job count, seeds (``seed=0`` ...), group-by columns and rows."""

    jobs: int
    seeds: frozenset[str]
    columns: tuple[str, ...]
    rows: frozenset[tuple[str, ...]]


def _csv_rows(path: Path) -> list[list[str]]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.reader(lines))


def seed_set(cells) -> frozenset[str]:
    """The seeds of a table's ``seeds`` cells (``"seed=0, seed=1"`` each)."""
    return frozenset(s.strip() for cell in cells for s in str(cell).split(",") if s.strip())


def table_journal(folder: Path, name: str) -> Path:
    """The journal of a write of table ``name`` in ``folder`` (``io.atomic.write_texts_together``):
    it exists only while (or because) a write of its three files stopped between the renames."""
    return Path(folder) / f".{name}.writing.json"


def settled_table(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """``<name>.md``, ``<name>.csv``, ``<name>.jobs.csv`` of ``folder``, after completing a write of
    them that was interrupted between its renames: what every reader of a table opens."""
    finish_interrupted(table_journal(folder, name))
    return tuple(Path(folder) / f"{name}{suffix}" for suffix in (".md", ".csv", ".jobs.csv"))


def committed_shape(results_dir: Path, name: str) -> TableShape | None:
    """The shape of the committed ``<name>.csv`` / ``<name>.jobs.csv`` (None when there is none)."""
    _, table, jobs = settled_table(results_dir, name)
    if not table.is_file():
        return None
    header, *body = _csv_rows(table) or [[]]
    if "n" not in header:
        return None
    columns = tuple(header[:header.index("n")])
    seeds_at = header.index("seeds") if "seeds" in header else None
    n_jobs = len(_csv_rows(jobs)) - 1 if jobs.is_file() else sum(int(r[len(columns)]) for r in body)
    return TableShape(jobs=n_jobs, seeds=seed_set(r[seeds_at] for r in body) if seeds_at is not None else frozenset(),
                      columns=columns, rows=frozenset(tuple(r[:len(columns)]) for r in body))


def shrink_problems(old: TableShape, new: TableShape) -> list[str]:
    """How ``new`` covers less than ``old`` (empty when it covers as much or more)."""
    problems = []
    if new.jobs < old.jobs:
        problems.append(f"{new.jobs} jobs (the committed table has {old.jobs})")
    missing = sorted(old.seeds - new.seeds)
    if missing:
        problems.append(f"seeds missing: {', '.join(missing)}")
    if new.columns != old.columns:
        problems.append(f"rows grouped by {list(new.columns)}, not {list(old.columns)}")
    else:
        lost = sorted(old.rows - new.rows)
        if lost:
            problems.append("rows missing: " + "; ".join(",".join(f"{c}={v}" for c, v in zip(old.columns, r))
                                                         for r in lost))
    return problems


def check_replacement(results_dir: Path, name: str, new: TableShape, allow_smaller: bool) -> None:
    """``ShrinkingTable`` when ``new`` would replace a committed table that covers more."""
    old = committed_shape(results_dir, name)
    if old is None or allow_smaller:
        return
    problems = shrink_problems(old, new)
    if problems:
        raise ShrinkingTable(f"refusing to replace the committed {results_dir.name}/{name}.md/.csv/.jobs.csv "
                             f"({old.jobs} jobs, {len(old.rows)} rows) by a smaller table: " + "; ".join(problems)
                             + ". Aggregate the whole sweep, or pass --allow-smaller (allow_smaller=True) to "
                             "replace it anyway.")
