"""The 8 UCI regression sets with the 20 standard splits (Hernandez-Lobato & Adams 2015).

Layout expected under ``<data_dir>/UCI/<name>/``: ``data.txt`` (whitespace-separated rows),
``index_features.txt``, ``index_target.txt``, ``index_train_<i>.txt``, ``index_test_<i>.txt``
(0-based row indices) and ``n_splits.txt``. Inputs and targets are standardised with the
statistics of the training part of the split (after the validation part is split off), so
the likelihood's sigma is in standardised units; ``target_mean``/``target_std`` convert back.
A split that leaks (test rows among the training rows, duplicate rows, the target among the
features) or is empty fails when the module is built, naming the file (``split_checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.data.checks import load_index, load_table
from laplace_lab.data.split_checks import check_uci_split
from laplace_lab.io.fields import option

UCI_DATASETS = (
    "boston-housing", "concrete", "energy", "kin8nm",
    "naval-propulsion-plant", "power-plant", "wine-quality-red", "yacht",
)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
UCI_FILES = ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt")


def check_trainable_size(name: str, y_train: np.ndarray, n_val: int, train_file: Path) -> None:
    """``ValueError`` unless the training rows ``y_train`` ``[n, D]`` (after ``n_val`` went to validation)
    are at least 2 with targets that vary: the targets are standardised by their std, which one row or
    a constant target makes 0 (every target NaN, every loss non-finite)."""
    n = len(y_train)
    if n < 2:
        raise ValueError(f"UCI set {name!r} is too small: {n} training row(s) in {train_file} after data.val_fraction "
                         f"held out {n_val} for validation; the targets are standardised by their std over the "
                         "training rows, which needs at least 2 rows with different targets")
    if (y_train.std(0) == 0).any():
        raise ValueError(f"UCI set {name!r}: the target is constant over the {n} training rows of {train_file}; "
                         "it cannot be standardised (std 0) and there is nothing to regress")


class UCIDataModule(LabDataModule):
    """One split of one UCI regression set, standardised.

    Options: ``name`` (one of ``UCI_DATASETS``); ``split``, the index of the standard split,
    ``0 <= split < n_splits`` (20 for all 8 sets; the upper bound is read from the set's
    ``n_splits.txt``); ``data_dir``, the root data directory (the set lives in
    ``<data_dir>/UCI/<name>``); ``val_fraction``, the fraction of the split's training rows held out
    for validation; ``dtype``, the tensors' precision (the network follows it).
    """

    @dataclass(frozen=True)
    class Options(LabDataModule.Options):
        name: str = option("yacht", "str", choices=UCI_DATASETS)
        split: int = option(0, "int", low=0)
        data_dir: str = option("data", "str")
        val_fraction: float = option(0.1, "float", low=0, high=1, high_open=True)
        dtype: str = option("float32", "str", choices=tuple(DTYPES))

    task = "regression"
    num_outputs = 1
    in_memory = True
    validation_option = "val_fraction"

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        self.dtype = DTYPES[o.dtype]
        self.name, self.split = o.name, o.split
        self.root = Path(o.data_dir) / "UCI" / o.name
        missing = [f for f in UCI_FILES if not (self.root / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"UCI dataset {o.name!r} not found: expected {list(UCI_FILES)} and index_train_<i>.txt / "
                f"index_test_<i>.txt in {self.root} (missing: {missing}). Set paths.data_dir or "
                f"LAPLACE_LAB_DATA_DIR to a folder containing UCI/{o.name}/."
            )
        n_splits = int((self.root / "n_splits.txt").read_text().split()[0])
        if not o.split < n_splits:
            raise ValueError(f"data.split={o.split} is out of range for {o.name}; allowed: 0..{n_splits - 1}")
        self.n_splits = n_splits
        self.val_fraction = o.val_fraction
        self._load()

    def data_files(self) -> list[Path]:
        """The files this split is read from (the MAP cache fingerprints them)."""
        return [self.root / f for f in ("data.txt", "index_features.txt", "index_target.txt",
                                        f"index_train_{self.split}.txt", f"index_test_{self.split}.txt")]

    def _load(self) -> None:
        data = load_table(self.root / "data.txt")  # finite, rectangular; errors name the file and line
        files = {"features": self.root / "index_features.txt", "target": self.root / "index_target.txt",
                 "train": self.root / f"index_train_{self.split}.txt", "test": self.root / f"index_test_{self.split}.txt"}
        features = load_index(files["features"], data.shape[1])
        target = load_index(files["target"], data.shape[1])
        train_idx = load_index(files["train"], len(data))
        test_idx = load_index(files["test"], len(data))
        check_uci_split(train_idx, test_idx, features, target, files)  # disjoint, no duplicates, no target feature
        perm = np.random.default_rng(self.seed).permutation(len(train_idx))
        n_val = int(round(self.val_fraction * len(train_idx)))
        if n_val >= len(train_idx):
            raise ValueError(f"data.val_fraction={self.val_fraction} leaves no training row of the {len(train_idx)} "
                             f"in {files['train']}; allowed: a fraction that keeps at least one")
        val_idx, train_idx = train_idx[perm[:n_val]], train_idx[perm[n_val:]]
        X, y = data[:, features], data[:, target].reshape(len(data), -1)
        x_mean, x_std = X[train_idx].mean(0), X[train_idx].std(0)
        x_std[x_std == 0] = 1.0
        y_mean, y_std = y[train_idx].mean(0), y[train_idx].std(0)
        check_trainable_size(self.name, y[train_idx], n_val, files["train"])
        self.input_shape = (X.shape[1],)
        self.target_mean = torch.as_tensor(y_mean, dtype=self.dtype)
        self.target_std = torch.as_tensor(y_std, dtype=self.dtype)

        def tensors(idx: np.ndarray) -> TensorDataset:
            Xs = torch.as_tensor((X[idx] - x_mean) / x_std, dtype=self.dtype)
            ys = torch.as_tensor((y[idx] - y_mean) / y_std, dtype=self.dtype)
            return TensorDataset(Xs, ys)

        self.train_set, self.val_set, self.test_set = tensors(train_idx), tensors(val_idx), tensors(test_idx)
