"""Checks of loaded data: each error names the file (and row) so a bad cell is found fast.

- ``load_table(path)``: a whitespace-separated numeric text table, ``[rows, cols]`` float64;
  unreadable or ragged rows and non-finite cells fail with the file and the 1-based line.
- ``load_index(path, n_rows)``: 0-based row indices ``[k]`` into a table of ``n_rows`` rows.
- ``check_finite(x, what, source)``: no ``nan`` / ``inf`` in a tensor; names the first bad row.
- ``check_labels(y, n_classes, source)``: class labels in ``0..n_classes-1``.
- ``check_idx_file(path)``: the header (type byte included) and size of an MNIST-style ``idx`` file
  (big-endian dims).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch

IDX_ITEM_SIZES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def load_table(path: Path) -> np.ndarray:
    """``path`` as a float64 array ``[rows, cols]``; ValueError naming the file and line otherwise."""
    try:
        data = np.loadtxt(path, ndmin=2)
    except ValueError as err:  # a non-numeric cell, a short (truncated) row, ...
        raise ValueError(f"{path}: cannot be read as a numeric table ({err}); the file may be truncated "
                         "or corrupt: restore it from the original data") from None
    bad = ~np.isfinite(data)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{path}: non-finite value {data[row, col]} at line {row + 1}, column {col + 1} "
                         f"({int(bad.any(1).sum())} rows affected); allowed: finite numbers only")
    return data


def load_index(path: Path, n_rows: int) -> np.ndarray:
    """0-based row indices ``[k]`` from ``path``, each in ``0..n_rows-1``."""
    try:
        with warnings.catch_warnings():  # an empty file: an empty index, which the split checks name
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            values = np.loadtxt(path, ndmin=1)
    except ValueError as err:
        raise ValueError(f"{path}: cannot be read as a list of row indices ({err})") from None
    bad = ~((values == np.round(values)) & (values >= 0) & (values < n_rows))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{path}: entry {values[i]:g} at position {i + 1} is not a row index; "
                         f"allowed: integers in 0..{n_rows - 1}")
    return values.astype(np.int64)


def check_finite(x: torch.Tensor, what: str, source: str) -> None:
    """Raise if ``x`` (``[N, ...]``) holds nan / inf, naming ``source`` and the first bad row."""
    if not x.is_floating_point() or x.numel() == 0:  # no rows (e.g. data.n_val=0): nothing to check
        return
    bad = ~torch.isfinite(x.reshape(len(x), -1)).all(1)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"{source}: non-finite {what} in row {row} (0-based; {int(bad.sum())} rows affected); "
                         "allowed: finite numbers only")


def check_labels(y: torch.Tensor, n_classes: int, source: str) -> None:
    """Raise if a label of ``y`` (``[N]`` integers) is outside ``0..n_classes-1``."""
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"{source}: label {int(y[row])} in row {row} (0-based) is out of range; allowed: "
                         f"0..{n_classes - 1} ({n_classes} classes; {int(bad.sum())} labels affected)")


def check_idx_file(path: Path, item_types: tuple[int, ...] = (0x08,)) -> tuple[int, ...]:
    """Validate an ``idx`` file's magic number, type byte (``item_types``; the MNIST family stores
    unsigned bytes, 0x08) and size; returns its dims."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(4)
        if len(header) < 4 or header[:2] != b"\x00\x00" or header[2] not in IDX_ITEM_SIZES or header[3] == 0:
            raise ValueError(f"{path}: not an idx file (bad magic number {header.hex() or 'empty'}); "
                             "the file is corrupt: delete it and download it again")
        if header[2] not in item_types:
            raise ValueError(f"{path}: idx type byte 0x{header[2]:02x} is not allowed here; allowed: "
                             f"{', '.join(f'0x{t:02x}' for t in item_types)} (unsigned bytes, as in every MNIST-family "
                             "file); the file is corrupt: delete it and download it again")
        ndim = header[3]
        raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise ValueError(f"{path}: truncated idx header; delete it and download it again")
    dims = tuple(int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in range(ndim))
    expected = 4 + 4 * ndim + math.prod(dims) * IDX_ITEM_SIZES[header[2]]
    if size != expected:
        raise ValueError(f"{path}: {size} bytes but its header {dims} needs {expected} (truncated or corrupt); "
                         "delete it and download it again")
    return dims
