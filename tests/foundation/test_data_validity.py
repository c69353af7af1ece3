"""Data that would give a wrong result fails before training, naming the file: leaky or empty UCI
splits, an idx file of the wrong type, and a failed download of a data set leaves no empty
folders in the (maybe shared) data folder. Also: ``lock_wait_s=nan`` is rejected."""

from __future__ import annotations

import math

import pytest

from laplace_lab.train import run
from tests.conftest import compose_config
from tests.foundation.test_bad_input import _edit_line, _replace, mnist_copy, no_training, uci_copy  # noqa: F401


def _lines(path):
    return path.read_text().split()


@pytest.mark.parametrize("leak,pattern", [
    ("test_in_train", r"index_test_0.txt: rows \d+.* are also in index_train_0.txt; allowed: test rows disjoint"),
    ("duplicate_train", r"index_train_0.txt: duplicate row indices \d+; allowed: each row at most once"),
    ("target_feature", r"index_features.txt: column\(s\) 6 are also the target \(index_target.txt\)"),
    ("empty_test", r"index_test_0.txt: no test rows \(an empty index file\)"),
    ("empty_train", r"index_train_0.txt: no train rows"),
])
def test_leaky_or_empty_uci_splits_fail_naming_the_file(uci_copy, tmp_path, no_training, leak, pattern):  # noqa: F811
    root = uci_copy / "UCI" / "yacht"
    train, test = root / "index_train_0.txt", root / "index_test_0.txt"
    if leak == "test_in_train":
        test.write_text("\n".join([*_lines(test), _lines(train)[0]]) + "\n")
    elif leak == "duplicate_train":
        train.write_text("\n".join([*_lines(train), _lines(train)[3]]) + "\n")
    elif leak == "target_feature":
        (root / "index_features.txt").write_text("\n".join([*_lines(root / "index_features.txt"), "6"]) + "\n")
    elif leak == "empty_test":
        test.write_text("")
    else:
        train.write_text("")
    cfg = compose_config(["data=uci", f"paths.data_dir={uci_copy}", "logger=csv"])
    with pytest.raises(ValueError, match=pattern):
        run(cfg, tmp_path / "run")


def test_a_uci_validation_fraction_that_leaves_no_training_row_fails(uci_copy):  # noqa: F811
    from laplace_lab.data import UCIDataModule

    root = uci_copy / "UCI" / "yacht"
    (root / "index_train_0.txt").write_text("\n".join(_lines(root / "index_train_0.txt")[:2]) + "\n")
    with pytest.raises(ValueError, match=r"data.val_fraction=0.9 leaves no training row of the 2 in .*index_train_0"):
        UCIDataModule(name="yacht", split=0, data_dir=str(uci_copy), val_fraction=0.9)


def test_an_empty_test_set_fails_before_training(tmp_path, no_training, monkeypatch):  # noqa: F811
    """Any data module: the last guard in training.build.build."""
    from laplace_lab.data.toy import Toy2DDataModule

    def no_test_rows(self, stage=None):
        self.test_set = type(self.test_set)(*(t[:0] for t in self.test_set.tensors))

    monkeypatch.setattr(Toy2DDataModule, "setup", no_test_rows)
    with pytest.raises(ValueError, match=r"data laplace_lab.data.Toy2DDataModule: the testing set is empty"):
        run(compose_config(["logger=csv"]), tmp_path)


def test_an_idx_file_of_the_wrong_type_names_the_file(mnist_copy):  # noqa: F811
    from laplace_lab.data.vision import load_tensors

    labels = mnist_copy / "t10k-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[2] = 0x09  # int8 instead of unsigned bytes
    _replace(labels, bytes(raw))
    with pytest.raises(ValueError, match=rf"{labels}: idx type byte 0x09 is not allowed here; allowed: 0x08"):
        load_tensors("mnist", mnist_copy.parent.parent, train=False)


def test_a_failed_ood_download_leaves_no_empty_folders(tmp_path, monkeypatch):
    """torchvision makes <root>/KMNIST/raw before it downloads; a failed download must not leave them."""
    import torchvision.datasets.mnist as tv_mnist

    from laplace_lab.data.vision import check_or_download

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", offline)
    root = tmp_path / "data"
    (root / "MNIST").mkdir(parents=True)  # the user's folder, with something in it
    (root / "EMPTY_BEFORE").mkdir()
    with pytest.raises(FileNotFoundError, match=r"dataset 'kmnist' not found .*download failed: OSError: no network"):
        check_or_download("kmnist", root, download=True)
    assert sorted(p.name for p in root.iterdir()) == ["EMPTY_BEFORE", "MNIST"]
    with pytest.raises(FileNotFoundError):
        check_or_download("kmnist", tmp_path / "new_root", download=True)
    assert not (tmp_path / "new_root").exists()


@pytest.mark.parametrize("wait", [math.nan, math.inf, -1.0, "soon", True])
def test_lock_wait_must_be_a_finite_number_of_seconds(wait):
    from laplace_lab.sweeps.callback import SweepSummary, check_options

    with pytest.raises(ValueError, match=r"hydra.callbacks.sweep_summary.lock_wait_s=.* is not allowed; allowed: a finite"):
        check_options(True, wait)
    with pytest.raises(SystemExit):
        SweepSummary(lock_wait_s=wait)
    with pytest.raises(ValueError, match=r"fail_on_error='yes' must be true or false"):
        check_options("yes", 0)
