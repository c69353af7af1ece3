"""Our numbers beside the authors' code, seed by seed: the peer CSVs that ``kind: peer`` reference
entries read (``experiments/<paper>/peer/*.csv``) and their paired verdict.

A peer CSV has one row per side, seed and setting: leading ``#`` lines say how it was made, then
a header with the required columns ``side`` (``ours`` or ``theirs``), ``seed``, ``commit`` (the
commit of the code that produced the row: ours, or the authors' repository) and ``command`` (how
it was run), any setting columns (``method``, ``data``, ...) and one column per metric (the
names of our metrics, e.g. ``test/la/ece``; an empty cell is a metric that side did not compute),
and last the line ``# rows: N`` (``peer_csv.seal``): a file cut off, even at a line boundary, is refused.

Paired judgement: for the rows of one setting, d_s = ours_s - theirs_s for every seed s that both
sides ran; ``paired`` gives (mean d, standard error of d, number of pairs). A metric *matches the
authors' code* when |mean d| <= 2 se(d) + tolerance (tolerance 0 unless an entry states one
with its reason); with fewer than two pairs it is not judged.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laplace_lab.reporting.peer_csv import ROWS_PREFIX, RowCountError, check_row_count
from laplace_lab.reporting.summary_stats import mean_se

SIDES = ("ours", "theirs")
REQUIRED_COLUMNS = ("side", "seed", "commit", "command")


class PeerCSVError(ValueError):
    """A malformed peer CSV; the message names the file, the line and the column."""


@dataclass(frozen=True)
class PeerTable:
    path: Path
    columns: tuple[str, ...]
    rows: tuple[dict[str, str], ...]
    comments: tuple[str, ...]


def _fail(path: Path, where: str, message: str) -> None:
    raise PeerCSVError(f"{path}: {where}: {message}")


def read_peer_csv(path: str | Path) -> PeerTable:
    """The validated CSV: required columns present, ``side`` in ``SIDES``, ``seed`` an integer,
    ``commit`` and ``command`` non-empty, metric cells numbers or empty, no (side, seed, setting)
    twice. Setting columns are those that are neither required nor numeric in every filled cell."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise PeerCSVError(f"{path}: cannot be read ({err})") from err
    try:
        check_row_count(path, lines)
    except RowCountError as err:
        raise PeerCSVError(str(err)) from None
    comments = tuple(line[1:].strip() for line in lines if line.startswith("#") and not line.startswith(ROWS_PREFIX))
    body = [line for line in lines if not line.startswith("#")]
    header_line = next(i for i, line in enumerate(lines, start=1) if not line.startswith("#")) if body else 0
    if not body:
        raise PeerCSVError(f"{path}: has no header line (columns {list(REQUIRED_COLUMNS)} required)")
    reader = csv.DictReader(body)
    columns = tuple(reader.fieldnames or ())
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        _fail(path, "header", f"missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
    rows = tuple(reader)
    if not rows:
        _fail(path, "body", "has no data rows")
    for i, row in enumerate(rows, start=header_line + 1):  # comment lines come first
        where = f"line {i}"
        if None in row or any(v is None for v in row.values()):
            cells = len(columns) - sum(v is None for v in row.values()) + len(row.get(None) or ())
            _fail(path, where, f"has {cells} cells where the header has {len(columns)} columns")
        if row["side"] not in SIDES:
            _fail(path, f"{where}, column `side`", f"{row['side']!r} is not allowed; allowed: {list(SIDES)}")
        try:
            int(row["seed"])
        except ValueError:
            _fail(path, f"{where}, column `seed`", f"{row['seed']!r} is not an integer seed")
        for column in ("commit", "command"):
            if not row[column].strip():
                _fail(path, f"{where}, column `{column}`", "is empty (every row records what produced it)")
    return PeerTable(path, columns, rows, comments)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def setting_columns(table: PeerTable) -> tuple[str, ...]:
    """Columns that pick a setting: not required, and not numeric in every non-empty cell."""
    return tuple(c for c in table.columns if c not in REQUIRED_COLUMNS
                 and not all(_is_number(r[c]) for r in table.rows if r[c] != ""))


def _same(a: str, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def side_values(table: PeerTable, select: dict[str, Any], metric: str, where: str) -> dict[str, dict[int, float]]:
    """``{side: {seed: value}}`` of ``metric`` over the rows matching ``select`` (empty cells left out).

    A ``select`` key or a ``metric`` that is not a column, a non-numeric metric cell, or two rows of
    one side and seed are a ``PeerCSVError`` naming ``where`` (the reference entry)."""
    unknown = [k for k in select if k not in table.columns]
    if unknown:
        _fail(table.path, where, f"field `row` key(s) {unknown} are not columns; allowed: "
                                 f"{list(setting_columns(table))}")
    if metric not in table.columns:
        metrics = [c for c in table.columns if c not in REQUIRED_COLUMNS and c not in setting_columns(table)]
        _fail(table.path, where, f"field `metric` {metric!r} is not a column; allowed: {metrics}")
    out: dict[str, dict[int, float]] = {s: {} for s in SIDES}
    for row in table.rows:
        if not all(_same(row[k], v) for k, v in select.items()) or row[metric] == "":
            continue
        if not _is_number(row[metric]):
            _fail(table.path, where, f"column {metric!r} has {row[metric]!r} (side {row['side']}, seed "
                                     f"{row['seed']}), not a number")
        seed = int(row["seed"])
        if seed in out[row["side"]]:
            _fail(table.path, where, f"side {row['side']!r} has seed {seed} twice for row {select}: add "
                                     "setting keys to `row` to pick one")
        out[row["side"]][seed] = float(row[metric])
    return out


def paired(values: dict[str, dict[int, float]]) -> tuple[float, float, int, list[int]]:
    """(mean of ours - theirs, its standard error, number of pairs, the paired seeds)."""
    seeds = sorted(set(values["ours"]) & set(values["theirs"]))
    mean, se, n = mean_se([values["ours"][s] - values["theirs"][s] for s in seeds])
    return mean, se, n, seeds


def matches(mean: float, se: float, n: int, tolerance: float = 0.0) -> bool | None:
    """|mean| <= 2 se + tolerance; None when n < 2 (no standard error: not judged)."""
    if n < 2 or not math.isfinite(se):
        return None
    return abs(mean) <= 2.0 * se + tolerance
