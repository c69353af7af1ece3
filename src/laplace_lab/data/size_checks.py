"""Size options checked against the data set before any data is loaded or generated.

- ``toy2d``: ``data.n_train`` at least the number of classes of ``data.kind`` (labels cycle through
  the classes, so fewer training points give a classifier with fewer outputs than the problem has:
  ``n_train=1`` trained a one-class network).
- image sets: ``data.n_val`` at most a fifth of the set's training images (``TRAIN_IMAGES``;
  ``fake_data``: ``data.fake_size``). Larger values used to be cut to a fifth silently (MNIST
  ``n_val=60000`` ran with 12000); the data module now refuses them too.

``check_data_sizes(data_cfg)`` raises ``ValueError`` naming the option, the data set and the allowed
range; ``config.validation.check_combinations`` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laplace_lab.data.toy import TOY2D_CLASSES

# training images of the torchvision sets (EMNIST: the balanced split)
TRAIN_IMAGES = {"mnist": 60000, "fashion_mnist": 60000, "kmnist": 60000, "emnist": 112800, "cifar10": 50000,
                "cifar100": 50000, "svhn": 73257}
VAL_FRACTION_MAX = 5  # at most 1 / VAL_FRACTION_MAX of the training images are held out for validation


def max_validation(n_train_images: int) -> int:
    """The most validation images a training set of ``n_train_images`` may give (a fifth)."""
    return n_train_images // VAL_FRACTION_MAX


def check_validation_size(name: str, n_val: int, n_train_images: int) -> None:
    """``data.n_val`` of image set ``name`` within ``0..max_validation(n_train_images)``."""
    top = max_validation(n_train_images)
    if not 0 <= n_val <= top:
        raise ValueError(f"data.n_val={n_val} is too large for {name}: its {n_train_images} training images give at "
                         f"most a fifth, {top}, to validation; allowed: 0..{top}")


def check_data_sizes(data: Mapping[str, Any]) -> None:
    """The checks above on the ``data`` node of a resolved config (other data modules: nothing)."""
    target = data.get("_target_")
    if target == "laplace_lab.data.Toy2DDataModule":
        kind, n_train = data.get("kind", "moons"), data.get("n_train")
        classes = TOY2D_CLASSES.get(kind)
        if classes is not None and isinstance(n_train, int) and n_train < classes:
            raise ValueError(f"data.n_train={n_train} is too small for data.kind={kind!r}, which has {classes} classes "
                             f"(each needs a training point); allowed: integers >= {classes}")
    elif target == "laplace_lab.data.VisionDataModule":
        name, n_val = data.get("name"), data.get("n_val", 5000)
        total = data.get("fake_size", 256) if name == "fake_data" else TRAIN_IMAGES.get(name)
        if isinstance(total, int) and isinstance(n_val, int):
            check_validation_size(name, n_val, total)
