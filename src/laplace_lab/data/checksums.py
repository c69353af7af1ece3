"""SHA-256 of the standard (uncompressed) MNIST and FashionMNIST idx files: a file with a valid header
and size but other bytes (random bytes, a damaged or replaced copy) trains normally otherwise.

``check_standard_file(name, path)`` raises ``ValueError`` naming the file when its digest differs from
the standard one; files of other sets (KMNIST, EMNIST, CIFAR, ...) and unknown names are not checked.
Hashing reads the file once (about 0.1 s for MNIST's 47 MB training images); a result is cached per
``(path, size, mtime)`` within a process.

The digests are of the files that torchvision's MNIST / FashionMNIST download decompresses (the
publishers' archives; the same values are published by other projects pinning these files).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

STANDARD_SHA256: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256(path: Path) -> str:
    """The file's SHA-256 (hex), cached per ``(path, size, mtime)``."""
    st = Path(path).stat()
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def check_standard_file(name: str, path: Path) -> None:
    """``ValueError`` if ``path`` is one of data set ``name``'s standard files and its bytes differ."""
    expected = STANDARD_SHA256.get(name, {}).get(Path(path).name)
    if expected is None:
        return
    got = sha256(path)
    if got != expected:
        raise ValueError(f"{path}: its bytes differ from the standard {name} file (sha256 {got[:16]}..., expected "
                         f"{expected[:16]}...): the file is corrupt or was replaced; delete it and download it again")
