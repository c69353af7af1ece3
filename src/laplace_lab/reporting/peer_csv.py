"""Pieces the peer scripts (``experiments/*/laplace_torch_reference.py``, ``experiments/*/peer/``) share:
their comma-separated choice options, their resumable CSV of one row per finished unit of work, and
the replacement of its ``side=ours`` rows."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path


def comma_choices(parser: argparse.ArgumentParser, flag: str, value: str, allowed: Sequence[str],
                  what: str = "are not supported") -> list[str]:
    """``value.split(",")``; ``parser.error`` naming ``flag`` and the allowed values on an unknown item."""
    items = value.split(",")
    unknown = [item for item in items if item not in allowed]
    if unknown:
        parser.error(f"{flag}: {unknown} {what}; allowed: {list(allowed)}")
    return items


def append_row(path: Path, row: dict, fields: Sequence[str], extrasaction: str = "raise") -> None:
    """Append ``row`` to the CSV at ``path`` (created with the ``fields`` header, and its folder, if
    absent); ``extrasaction`` as ``csv.DictWriter``'s."""
    new_file = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction=extrasaction)
        if new_file:
            writer.writeheader()
        writer.writerow(row)


def replace_ours_rows(path: Path, rows: list[dict], fields: Sequence[str], extrasaction: str = "raise") -> int:
    """Rewrite the peer CSV at ``path`` with its ``#`` comment lines and its rows of any other side
    (``side != "ours"``) kept, then ``rows``; missing fields are written empty, ``extrasaction`` as
    ``csv.DictWriter``'s. Returns the number of rows kept."""
    lines = path.read_text().splitlines(keepends=True)
    comments = [line for line in lines if line.startswith("#")]
    kept = [r for r in csv.DictReader(line for line in lines if not line.startswith("#")) if r["side"] != "ours"]
    with path.open("w", newline="") as f:
        f.writelines(comments)
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction=extrasaction)
        writer.writeheader()
        writer.writerows(kept + rows)
    return len(kept)
