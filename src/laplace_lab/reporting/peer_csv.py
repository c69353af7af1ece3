"""Pieces the peer scripts (``experiments/*/laplace_torch_reference.py``, ``experiments/*/peer/``) share:
their comma-separated choice options, their resumable CSV of one row per finished unit of work, the
replacement of its ``side=ours`` rows, and the row count that ends a peer CSV.

A peer CSV (``experiments/*/peer/*.csv``) ends with the line ``# rows: N``, N its data rows (the
header and ``#`` lines not counted), written by ``seal`` once the script has written its rows
(``replace_ours_rows`` seals too). A file cut off at a line boundary is otherwise a valid, shorter
CSV; with the count it is refused by ``check_row_count`` (``peer_pairs.read_peer_csv``), naming the
file and both counts. ``python -m laplace_lab.reporting.peer_csv --seal FILE...`` seals files by hand
(after checking their rows: a seal states that the file is whole)."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from laplace_lab.io.atomic import write_bytes_atomic

ROWS_PREFIX = "# rows: "  # the last line of a peer CSV: "# rows: <its number of data rows>"


class RowCountError(ValueError):
    """A peer CSV whose ``# rows: N`` line is missing, not last, or says another number of rows."""


def comma_choices(parser: argparse.ArgumentParser, flag: str, value: str, allowed: Sequence[str],
                  what: str = "are not supported") -> list[str]:
    """``value.split(",")``; ``parser.error`` naming ``flag`` and the allowed values on an unknown item."""
    items = value.split(",")
    unknown = [item for item in items if item not in allowed]
    if unknown:
        parser.error(f"{flag}: {unknown} {what}; allowed: {list(allowed)}")
    return items


def append_row(path: Path, row: dict, fields: Sequence[str], extrasaction: str = "raise", counted: bool = False) -> None:
    """Append ``row`` to the CSV at ``path`` (created with the ``fields`` header, and its folder, if
    absent); ``extrasaction`` as ``csv.DictWriter``'s. ``counted`` (a peer CSV): the file is rewritten
    whole with the row and its new ``# rows: N`` last line (``seal``), so a stop never leaves it unsealed."""
    new_file = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(fields), extrasaction=extrasaction)
    if new_file:
        writer.writeheader()
    writer.writerow(row)
    if counted:
        _write_sealed(path, [*([] if new_file else _lines(path)), *text.getvalue().splitlines(keepends=True)])
        return
    with path.open("a", newline="") as f:
        f.write(text.getvalue())


def replace_ours_rows(path: Path, rows: list[dict], fields: Sequence[str], extrasaction: str = "raise") -> int:
    """Rewrite the peer CSV at ``path`` with its ``#`` comment lines and its rows of any other side
    (``side != "ours"``) kept, then ``rows``; missing fields are written empty, ``extrasaction`` as
    ``csv.DictWriter``'s. Returns the number of rows kept."""
    lines = path.read_text().splitlines(keepends=True)
    comments = [line for line in lines if line.startswith("#") and not line.startswith(ROWS_PREFIX)]
    kept = [r for r in csv.DictReader(line for line in lines if not line.startswith("#")) if r["side"] != "ours"]
    with path.open("w", newline="") as f:
        f.writelines(comments)
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction=extrasaction)
        writer.writeheader()
        writer.writerows(kept + rows)
    seal(path)
    return len(kept)


def data_rows(lines: Sequence[str]) -> int:
    """The number of CSV records after the header among ``lines`` (the ``#`` lines left out)."""
    records = list(csv.reader(line for line in lines if not line.startswith("#")))
    return max(len([r for r in records if r]) - 1, 0)


def _lines(path: Path) -> list[str]:
    """The lines of ``path`` with their own line ends (the writers end rows with ``\\r\\n``, comments
    with ``\\n``), the count line left out."""
    with Path(path).open(newline="") as f:
        return [line for line in f.read().splitlines(keepends=True) if not line.startswith(ROWS_PREFIX)]


def _write_sealed(path: Path, lines: list[str]) -> int:
    """Write ``lines`` and then ``# rows: N`` to ``path``, whole (``io.atomic``); returns N."""
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    n = data_rows([line.rstrip("\r\n") for line in lines])
    write_bytes_atomic(Path(path), "".join([*lines, f"{ROWS_PREFIX}{n}\n"]).encode())
    return n


def seal(path: Path) -> int:
    """End the peer CSV at ``path`` with ``# rows: N`` (any earlier count line removed, every other byte
    kept); returns N."""
    return _write_sealed(path, _lines(path))


def check_row_count(path: Path, lines: Sequence[str]) -> None:
    """``RowCountError`` unless the last of ``lines`` (the file's, newline-free) is ``# rows: N`` with N
    its data rows, and no other line is a count: the file is whole."""
    fix = (f"rerun the script that writes it (see its '# made by' line), or, after checking its rows, "
           f"python -m laplace_lab.reporting.peer_csv --seal {path}")
    counts = [i for i, line in enumerate(lines, start=1) if line.startswith(ROWS_PREFIX)]
    if not counts:
        raise RowCountError(f"{path}: no '{ROWS_PREFIX}N' line at its end, so it may be cut off (a peer CSV ends "
                            f"with its row count; this one has {data_rows(lines)} data rows); {fix}")
    last = len(lines) - next(i for i, line in enumerate(reversed(lines)) if line.strip())
    if counts[-1] != last or len(counts) > 1:
        raise RowCountError(f"{path}: line {counts[0]} '{lines[counts[0] - 1]}' is not the file's last line: rows "
                            f"were added after it was sealed, or two files were joined; {fix}")
    text = lines[last - 1][len(ROWS_PREFIX):].strip()
    if not text.isdigit():
        raise RowCountError(f"{path}: line {last} '{lines[last - 1]}': the row count must be a whole number; {fix}")
    if int(text) != (n := data_rows(lines)):
        raise RowCountError(f"{path}: line {last} says {int(text)} data rows, the file has {n}: cut off or edited "
                            f"since it was written; {fix}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m laplace_lab.reporting.peer_csv",
                                     description="End peer CSVs with their row count ('# rows: N').")
    parser.add_argument("--seal", nargs="+", type=Path, required=True, metavar="FILE", help="peer CSVs to seal")
    args = parser.parse_args(argv)
    for path in args.seal:
        if not path.is_file():
            parser.error(f"--seal: {path} is not a file")
    for path in args.seal:
        print(f"{path}: {seal(path)} rows")


if __name__ == "__main__":
    main(sys.argv[1:])
