"""Checks of a data split before training: no test row leaks into training, nothing is empty.

``check_uci_split`` (``data.uci``): the split files of one UCI set must give training and test rows
that are disjoint, without duplicates, in range, and not empty, and the target column must not be
among the features (a leaky split gave a normal run: test RMSE 1.02 or 0.40 on yacht split 0,
where the clean split gives 1.55). Each error names the file. ``check_nonempty`` is the last
guard of every data module (``training.build.build``): an empty training or test set fails before training,
not after it (a ``cannot reshape tensor of 0 elements`` at evaluation).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _duplicates(idx: np.ndarray) -> list[int]:
    values, counts = np.unique(idx, return_counts=True)
    return values[counts > 1].tolist()


def _few(values: list[int], n: int = 5) -> str:
    return ", ".join(map(str, values[:n])) + (f", ... ({len(values)} in all)" if len(values) > n else "")


def check_uci_split(train_idx: np.ndarray, test_idx: np.ndarray, features: np.ndarray, target: np.ndarray,
                    files: dict[str, Path]) -> None:
    """``ValueError`` naming the file when the split leaks or is empty. ``files``: the paths of
    ``train``, ``test``, ``features`` and ``target`` (row indices already checked in range by
    ``checks.load_index``)."""
    for part, idx in (("train", train_idx), ("test", test_idx)):
        if len(idx) == 0:
            raise ValueError(f"{files[part]}: no {part} rows (an empty index file); allowed: at least one row index")
        dups = _duplicates(idx)
        if dups:
            raise ValueError(f"{files[part]}: duplicate row indices {_few(dups)}; allowed: each row at most once "
                             f"(a duplicate weighs a row twice)")
    shared = np.intersect1d(train_idx, test_idx).tolist()
    if shared:
        raise ValueError(f"{files['test']}: rows {_few(shared)} are also in {files['train'].name}; allowed: test rows "
                         "disjoint from the training rows (a shared row leaks test data into training)")
    leak = np.intersect1d(features, target).tolist()
    if leak:
        raise ValueError(f"{files['features']}: column(s) {_few(leak)} are also the target ({files['target'].name}); "
                         "allowed: features without the target column")
    dups = _duplicates(features)
    if dups:
        raise ValueError(f"{files['features']}: duplicate column indices {_few(dups)}; allowed: each column at most once")


def check_nonempty(datamodule, what: str) -> None:
    """``ValueError`` when the data module's training or test set has no rows (``what`` names its options)."""
    for part in ("train_set", "test_set"):
        dataset = getattr(datamodule, part, None)
        if dataset is not None and len(dataset) == 0:
            raise ValueError(f"{what}: the {part.removesuffix('_set')}ing set is empty; allowed: at least one "
                             f"{part.removesuffix('_set')} row")
