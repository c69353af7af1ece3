"""The MAP cache's data fingerprint: content-based (relative path, size, SHA-256), so a data folder
copied elsewhere keeps the key and a changed file changes it."""

import shutil
from pathlib import Path

from laplace_lab.training.map_cache import data_fingerprint


class _Files:
    def __init__(self, root: Path):
        self.root = root

    def data_files(self):
        return [self.root / "MNIST" / "raw" / "train", self.root / "MNIST" / "raw" / "test"]


def _make(root: Path, train: bytes = b"abc") -> _Files:
    (root / "MNIST" / "raw").mkdir(parents=True)
    (root / "MNIST" / "raw" / "train").write_bytes(train)
    (root / "MNIST" / "raw" / "test").write_bytes(b"xyz")
    return _Files(root)


def test_copied_folder_has_the_same_fingerprint(tmp_path):
    a = _make(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")  # new path, new mtimes
    fp = data_fingerprint(a)
    assert fp == data_fingerprint(_Files(tmp_path / "elsewhere" / "b"))
    assert [row[0] for row in fp] == ["MNIST/raw/test", "MNIST/raw/train"]


def test_changed_contents_change_the_fingerprint(tmp_path):
    assert data_fingerprint(_make(tmp_path / "a")) != data_fingerprint(_make(tmp_path / "b", train=b"abd"))
