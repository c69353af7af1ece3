"""The validation size of an image set: ``data.n_val`` at most a fifth of its training images
(larger values used to be cut to a fifth silently: MNIST ``n_val=60000`` ran with 12000).

``check_validation_size`` raises ``ValueError`` naming the option, the data set and the allowed range;
``VisionDataModule.check_sizes`` calls it before any data loads (each data module declares its own size
limits in ``check_sizes``, see ``data.base.LabDataModule``), and ``VisionDataModule.setup`` again on
the images it read.
"""

from __future__ import annotations

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
