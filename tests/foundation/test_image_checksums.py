"""MNIST / FashionMNIST files with a valid idx header and size but other bytes (random bytes, a replaced
copy) are refused, naming the file (``data.checksums``); the standard files pass."""

from __future__ import annotations

import numpy as np
import pytest

from laplace_lab.data.checksums import STANDARD_SHA256, check_standard_file, sha256
from tests.foundation.test_bad_input import _replace, mnist_copy  # noqa: F401


def _random_idx_images(n: int, seed: int = 0) -> bytes:
    """A well-formed idx3 file of ``n`` random 28x28 images (passes the header and size checks)."""
    header = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (n, 28, 28))
    return header + np.random.default_rng(seed).integers(0, 256, n * 28 * 28, dtype=np.uint8).tobytes()


def test_a_standard_name_with_other_bytes_is_refused(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(_random_idx_images(3))
    for name in ("mnist", "fashion_mnist"):
        with pytest.raises(ValueError, match=rf"{path}: its bytes differ from the standard {name} file"):
            check_standard_file(name, path)
    check_standard_file("kmnist", path)  # no table for KMNIST: not checked
    other = tmp_path / "my-images-idx3-ubyte"
    other.write_bytes(b"x")
    check_standard_file("mnist", other)  # not a standard file name: not checked


def test_sha256_follows_a_rewritten_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a")
    first = sha256(path)
    path.write_bytes(b"bb")  # other size: the cache key changes
    assert sha256(path) != first


def test_random_training_images_are_refused_by_the_loader(mnist_copy):  # noqa: F811
    """The MNIST training images replaced by random bytes of the right layout."""
    from laplace_lab.data.vision import load_tensors

    images = mnist_copy / "train-images-idx3-ubyte"
    _replace(images, _random_idx_images(60000))
    with pytest.raises(ValueError, match=rf"{images}: its bytes differ from the standard mnist file"):
        load_tensors("mnist", mnist_copy.parent.parent, train=True)


def test_the_standard_files_pass(data_dir):
    for name, folder in (("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")):
        for file in STANDARD_SHA256[name]:
            check_standard_file(name, data_dir / folder / "raw" / file)
