"""Pieces the laplace-torch peer scripts (``experiments/*/laplace_torch_reference.py``) share: their
comma-separated choice options and their resumable CSV of one row per finished unit of work."""

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
