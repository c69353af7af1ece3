"""Image classification sets through torchvision, held in memory as tensors in [0, 1].

Images are not normalised here (models that want normalisation do it themselves), so every
pixel lies in ``input_range = (0, 1)``, which FGSM clamps to. Each dataset is checked for its
files when the data module is built: torchvision downloads the training set where it can, and
where it cannot, the error names the dataset, the directory and the files expected there, before
any training. The optional OOD sets are looked for on disk only, never downloaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from laplace_lab.data.base import LabDataModule, split_off_validation
from laplace_lab.data.checks import check_finite, check_idx_file, check_labels
from laplace_lab.data.checksums import check_standard_file
from laplace_lab.data.size_checks import check_validation_size
from laplace_lab.data.transformed import TRANSFORMS, transform_images
from laplace_lab.io.fields import option

log = logging.getLogger(__name__)

_MNIST_RAW = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class VisionSpec:
    """How to load one torchvision dataset and which files it needs under the data dir."""

    cls: str
    shape: tuple[int, int, int]
    classes: int
    files: tuple[str, ...]
    train_images: int | None  # the training split's size (None: fake_data, data.fake_size)
    kwargs: tuple[tuple[str, object], ...] = ()
    split_arg: bool = False  # SVHN takes split="train"/"test" instead of train=True/False


VISION_DATASETS: dict[str, VisionSpec] = {
    "mnist": VisionSpec("MNIST", (1, 28, 28), 10, tuple(f"MNIST/raw/{f}" for f in _MNIST_RAW), 60000),
    "fashion_mnist": VisionSpec("FashionMNIST", (1, 28, 28), 10, tuple(f"FashionMNIST/raw/{f}" for f in _MNIST_RAW),
                                60000),
    "kmnist": VisionSpec("KMNIST", (1, 28, 28), 10, tuple(f"KMNIST/raw/{f}" for f in _MNIST_RAW), 60000),
    "emnist": VisionSpec(  # the balanced split
        "EMNIST", (1, 28, 28), 47,
        tuple(f"EMNIST/raw/emnist-balanced-{f}" for f in _MNIST_RAW), 112800,
        kwargs=(("split", "balanced"),),
    ),
    "cifar10": VisionSpec("CIFAR10", (3, 32, 32), 10, ("cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/test_batch"),
                          50000),
    "cifar100": VisionSpec("CIFAR100", (3, 32, 32), 100, ("cifar-100-python/train", "cifar-100-python/test"), 50000),
    "svhn": VisionSpec("SVHN", (3, 32, 32), 10, ("train_32x32.mat", "test_32x32.mat"), 73257, split_arg=True),
    "fake_data": VisionSpec("FakeData", (3, 32, 32), 10, (), None),
}


def check_or_download(name: str, root: Path, download: bool) -> None:
    """Make sure ``name``'s files are under ``root``; try torchvision's download if allowed.

    Raises ``FileNotFoundError`` naming the dataset, the directory and the expected files. A failed
    download leaves no empty folder behind (``_remove_new_empty_folders``).
    """
    spec = VISION_DATASETS[name]
    if not missing_files(name, root):
        return
    reason = "download=false"
    if download:
        before = _folders(root)
        try:
            _torchvision_dataset(name, root, train=True, download=True)
            _torchvision_dataset(name, root, train=False, download=True)
            return
        except Exception as err:  # no internet, mirror down, read-only dir ...
            reason = f"download failed: {type(err).__name__}: {err}"
            _remove_new_empty_folders(root, before)
    raise FileNotFoundError(
        f"dataset {name!r} not found in {root} ({reason}). Expected files: {list(spec.files)}. "
        f"Place them there, or set paths.data_dir / LAPLACE_LAB_DATA_DIR to a folder that has them."
    )


def missing_files(name: str, root: Path) -> list[str]:
    """The files of ``name`` (``VisionSpec.files``, relative to ``root``) that are not there."""
    return [f for f in VISION_DATASETS[name].files if not (root / f).exists()]


def check_ood_sets(names: list[str], root: Path, if_missing: str) -> tuple[list[str], list[str]]:
    """Split the OOD sets ``names`` into those whose files are under ``root`` and those that are
    not, looking on disk only: an OOD set is optional, so it is never downloaded. ``if_missing``:
    ``error`` raises one ``FileNotFoundError`` naming every missing set and its expected files;
    ``skip`` logs one warning line naming them. Returns ``(present, skipped)``."""
    missing = {n: missing_files(n, root) for n in names}
    present = [n for n in names if not missing[n]]
    skipped = [n for n in names if missing[n]]
    if skipped and if_missing == "error":
        expected = "; ".join(f"{n}: {list(VISION_DATASETS[n].files)}" for n in skipped)
        raise FileNotFoundError(
            f"OOD set(s) {skipped} not found in {root} (OOD sets are not downloaded). Expected files: {expected}. "
            "Place them there, or set data.ood_if_missing=skip to evaluate without them")
    if skipped:
        log.warning("OOD set(s) %s not in %s (not downloaded; data.ood_if_missing=skip): evaluated without them",
                    ", ".join(skipped), root)
    return present, skipped


def _folders(root: Path) -> set[Path]:
    return {Path(d) for d, _, _ in os.walk(root)} if root.is_dir() else set()


def _remove_new_empty_folders(root: Path, before: set[Path]) -> None:
    """Remove the folders a failed download created under ``root`` (the user's data folder, maybe
    shared) that are empty, deepest first; files it left, and every folder that was there, stay."""
    for folder in sorted(_folders(root) - before, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty
    if root not in before:
        with contextlib.suppress(OSError):
            root.rmdir()


def _torchvision_dataset(name: str, root: Path, train: bool, download: bool = False, **extra) -> Dataset:
    spec = VISION_DATASETS[name]
    import torchvision  # here: registering the data modules' schema nodes must not load torchvision

    cls = getattr(torchvision.datasets, spec.cls)
    kwargs = dict(spec.kwargs) | extra
    if name == "fake_data":
        return cls(size=kwargs.get("size", 256), image_size=spec.shape, num_classes=spec.classes,
                   random_offset=0 if train else 10**6, transform=torchvision.transforms.ToTensor())
    if spec.split_arg:
        return cls(root=str(root), split="train" if train else "test", download=download, **kwargs)
    return cls(root=str(root), train=train, download=download, **kwargs)


def _split_files(name: str, root: Path, train: bool) -> list[Path]:
    """The files of one split: ``[images, labels]`` for the MNIST family (idx files), all otherwise."""
    files = [root / f for f in VISION_DATASETS[name].files]
    if files and all("idx" in f.name for f in files):
        return [f for f in files if ("train-" if train else "t10k-") in f.name]
    return files


def load_tensors(name: str, root: Path, train: bool, fake_size: int = 256) -> TensorDataset:
    """Load a split of ``name`` as a ``TensorDataset`` of float images ``[N, C, H, W]`` in [0, 1]
    and long labels ``[N]``. Corrupt files, non-finite pixels and labels outside
    ``0..classes-1`` raise ``ValueError`` naming the file, and so do MNIST / FashionMNIST files whose
    bytes are not the standard files' (``checksums``)."""
    files = _split_files(name, root, train)
    for path in files:
        if "idx" in path.name:
            check_idx_file(path)
    source = ", ".join(map(str, files)) or f"dataset {name!r}"
    try:
        ds = _torchvision_dataset(name, root, train, **({"size": fake_size} if name == "fake_data" else {}))
    except (RuntimeError, ValueError, TypeError, AssertionError, OSError, EOFError) as err:
        raise ValueError(f"dataset {name!r}: cannot read {source} ({type(err).__name__}: {err}); the files may "
                         "be truncated or corrupt: delete them and download them again") from err
    if name == "fake_data":
        X = torch.stack([ds[i][0] for i in range(len(ds))])
        y = torch.as_tensor([int(ds[i][1]) for i in range(len(ds))])
        return TensorDataset(X, y)
    data = ds.data
    data = torch.as_tensor(data)
    if data.ndim == 3:  # MNIST family: [N, H, W]
        if name == "emnist":  # EMNIST is stored transposed
            data = data.transpose(1, 2)
        data = data[:, None]
    elif data.shape[-1] == 3:  # CIFAR: [N, H, W, C]
        data = data.permute(0, 3, 1, 2)
    labels = torch.as_tensor(ds.targets if hasattr(ds, "targets") else ds.labels).long()
    images = data.float().div_(255.0).contiguous()
    if len(images) != len(labels):
        raise ValueError(f"dataset {name!r}: {len(images)} images but {len(labels)} labels in {source}")
    check_finite(images, "pixels", source)
    idx_labels = [f for f in files if "labels-idx" in f.name]
    check_labels(labels, VISION_DATASETS[name].classes, str(idx_labels[0]) if idx_labels else source)
    for path in files:  # last: the specific errors above name what is wrong first
        check_standard_file(name, path)
    return TensorDataset(images, labels)


def _transformed(ds: TensorDataset, kind: str, train: bool) -> TensorDataset:
    X, y = ds.tensors
    return TensorDataset(transform_images(X, kind, train), y)


class AugmentedDataset(Dataset):
    """Random crop (zero padding ``pad``) and horizontal flip on a tensor image dataset."""

    def __init__(self, base: Dataset, pad: int = 4):
        self.base, self.pad = base, pad

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        h, w = x.shape[-2:]
        padded = torch.nn.functional.pad(x, [self.pad] * 4)
        top, left = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
        return padded[:, top:top + h, left:left + w], y


TEST_HOLDOUT_SEED = 42  # the Laplace Redux authors' val_test_split generator seed


def hold_out_test(test: Dataset, n_holdout: int) -> Dataset:
    """``test`` less its first ``n_holdout`` images of ``randperm(len(test))`` seeded
    ``TEST_HOLDOUT_SEED`` (the rest in that order); ``test`` itself when ``n_holdout == 0``."""
    if n_holdout == 0:
        return test
    if n_holdout >= len(test):
        raise ValueError(f"data.test_holdout={n_holdout} leaves no test image (the test set has {len(test)}); "
                         f"allowed: 0 to {len(test) - 1}")
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(TEST_HOLDOUT_SEED)).tolist()
    return Subset(test, order[n_holdout:])


class VisionDataModule(LabDataModule):
    """A torchvision classification set with a fixed-seed validation split and OOD test sets.

    Options:
        name: one of ``VISION_DATASETS``.
        data_dir: root data directory (torchvision layout).
        n_val: validation images split off the training set by ``seed``; at most a fifth of it
            (``check_sizes``, from ``VisionSpec.train_images``).
        n_train_subset: keep only the first k training images (after the split); ``None`` = all.
        ood: names of out-of-distribution test sets (keys of ``VISION_DATASETS``).
        ood_if_missing: ``error`` (fail at construction) or ``skip`` (one warning line, record in
            ``ood_skipped``); OOD sets are looked for on disk only (``check_ood_sets``).
        augment: random crop + flip on training images (CIFAR-style).
        download: let torchvision try to download missing files of ``name`` (not the OOD sets).
        fake_size: number of images of ``fake_data`` per split (smoke tests).
        transform: fixed-seed transformed variant of both splits (``data.transformed``): ``none`` |
            ``rotated_full`` | ``rotated_partial`` | ``translated``.
        test_holdout: test images left out of every metric: the first ``test_holdout`` of
            ``torch.randperm(n_test)`` under a generator seeded ``TEST_HOLDOUT_SEED`` (42), i.e.
            ``random_split(test, (test_holdout, n_test - test_holdout), generator)`` as the Laplace
            Redux authors' ``val_test_split``; the test set is the rest, in that permuted order (so
            rotated-MNIST's first batches are too). ``0``: all test images, in file order. The OOD
            sets are never cut (the authors use them whole).
    """

    @dataclass(frozen=True)
    class Options(LabDataModule.Options):
        name: str = option("mnist", "str", choices=tuple(VISION_DATASETS))
        data_dir: str = option("data", "str")
        n_val: int = option(5000, "int", low=0)
        n_train_subset: int | None = option(None, "int", low=1, nullable=True)
        ood: list = option([], "list", choices=tuple(VISION_DATASETS))
        ood_if_missing: str = option("skip", "str", choices=("error", "skip"))
        augment: bool = option(False, "bool")
        download: bool = option(True, "bool")
        fake_size: int = option(256, "int", low=1)
        transform: str = option("none", "str", choices=TRANSFORMS)
        test_holdout: int = option(0, "int", low=0,
                                   message="{name} must be an integer >= 0 (test images left out); got {value!r}")

    task = "classification"
    input_range = (0.0, 1.0)
    validation_option = "n_val"
    images = True

    @classmethod
    def check_sizes(cls, options: Options) -> None:
        """``data.n_val`` at most a fifth of the set's training images (``fake_data``: ``fake_size``)."""
        total = VISION_DATASETS[options.name].train_images or options.fake_size
        check_validation_size(options.name, options.n_val, total)

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        self.test_holdout, self.transform = o.test_holdout, o.transform
        self.name, self.root = o.name, Path(o.data_dir)
        self.n_val, self.n_train_subset, self.augment, self.fake_size = o.n_val, o.n_train_subset, o.augment, o.fake_size
        spec = VISION_DATASETS[o.name]
        self.input_shape, self.num_outputs = spec.shape, spec.classes
        check_or_download(o.name, self.root, o.download)
        self.ood_names, self.ood_skipped = check_ood_sets(list(o.ood), self.root, o.ood_if_missing)
        self._loaded = False

    def data_files(self) -> list[Path]:
        """The training and test files of ``name`` (the MAP cache fingerprints them)."""
        return [self.root / f for f in VISION_DATASETS[self.name].files]

    def setup(self, stage: str | None = None) -> None:
        if self._loaded:
            return
        full_train = _transformed(load_tensors(self.name, self.root, train=True, fake_size=self.fake_size),
                                  self.transform, train=True)
        check_validation_size(self.name, self.n_val, len(full_train))  # (no silent cut to a fifth)
        train, self.val_set = split_off_validation(full_train, self.n_val, self.seed)
        if self.n_train_subset is not None:
            train = Subset(train, range(min(self.n_train_subset, len(train))))
        self.train_plain = train
        self.train_set = AugmentedDataset(train) if self.augment else train
        test = _transformed(load_tensors(self.name, self.root, train=False, fake_size=self.fake_size),
                            self.transform, train=False)
        self.test_set = hold_out_test(test, self.test_holdout)
        self._loaded = True

    def train_eval_dataloader(self, batch_size: int | None = None) -> DataLoader:
        """Training images without augmentation, in fixed order (for Laplace fits)."""
        self.setup("fit")
        return self._loader(self.train_plain, shuffle=False, batch_size=batch_size or self.eval_batch_size)

    def ood_dataloaders(self) -> dict[str, DataLoader]:
        """Test splits of the configured OOD sets that are available."""
        return {
            n: self._loader(load_tensors(n, self.root, train=False, fake_size=self.fake_size), shuffle=False)
            for n in self.ood_names
        }
