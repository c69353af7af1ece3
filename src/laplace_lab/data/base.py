"""Common interface of every data module in laplace-lab.

A data module states what the rest of the pipeline needs to build a model, a likelihood and
the evaluation, so nothing downstream special-cases datasets:

- ``task``: ``"classification"`` or ``"regression"``.
- ``input_shape``: shape of one input without the batch dimension.
- ``num_outputs``: number of classes, or number of regression targets.
- ``n_train``: size of the training set (the N in the prior term ``delta ||theta||^2 / (2N)``).
- ``target_mean`` / ``target_std``: for regression, the statistics used to standardise
  targets (tensors of shape ``[num_outputs]``), so metrics can be reported in original units.
- ``input_range``: valid range of inputs (used to clamp adversarial inputs).
- ``ood_dataloaders()``: test loaders of out-of-distribution sets, keyed by dataset name.

A data module is a plain object unless Lightning is already imported when it is created: then it
is a ``LightningDataModule`` (``LabDataModule.__new__``), so Lightning's Trainer takes it, while
the plain loop (``training.plain_loop``) runs without importing Lightning.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset, random_split

from laplace_lab.io.declare import Declared
from laplace_lab.io.fields import option


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """``[n]`` random permutation that depends only on ``(seed, epoch)``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


class EpochShuffleSampler(Sampler[int]):
    """Random permutation that depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch`` at the start of every epoch, so a run resumed from a
    checkpoint sees the same data order as the uninterrupted run.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(epoch_permutation(self.n, self.seed, self.epoch).tolist())


class TensorRows(Dataset):
    """Rows ``index`` (``[n]`` long, or ``None``: all) of in-memory ``tensors``; indexed by a ``[B]``
    long tensor of positions it returns the whole batch (fresh tensors) in one gather per tensor."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], index: torch.Tensor | None = None):
        self.tensors, self.index = tensors, index

    @classmethod
    def of(cls, dataset: Dataset) -> TensorRows | None:
        """A ``TensorDataset``, possibly under ``Subset``s (their indices composed once), else ``None``."""
        index = None
        while isinstance(dataset, Subset):
            idx = torch.as_tensor(dataset.indices, dtype=torch.long)
            index = idx if index is None else idx[index]
            dataset = dataset.dataset
        return cls(dataset.tensors, index) if isinstance(dataset, TensorDataset) else None

    def __len__(self) -> int:
        return len(self.tensors[0]) if self.index is None else len(self.index)

    def __getitem__(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = positions if self.index is None else self.index[positions]
        return tuple(t[rows] for t in self.tensors)


class BatchIndexSampler(Sampler[torch.Tensor]):
    """``[B]`` position tensors of consecutive batches of ``range(n)`` or, with ``shuffle``, of
    ``epoch_permutation(n, seed, epoch)``: the batches a ``DataLoader`` builds from
    ``EpochShuffleSampler`` (or no sampler) and ``batch_size``, last batch partial."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int):
        self.n, self.batch_size, self.shuffle, self.seed, self.epoch = n, batch_size, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self):
        # a generator: the order is drawn at the first batch, not at iter(); Lightning may create the
        # epoch's iterator before it calls set_epoch (a run resumed from a checkpoint does)
        order = epoch_permutation(self.n, self.seed, self.epoch) if self.shuffle else torch.arange(self.n)
        yield from order.split(self.batch_size)


@functools.cache
def _lightning_variant(cls: type) -> type:
    """``cls`` with ``LightningDataModule`` after it in the MRO (the order of a direct subclass)."""
    import pytorch_lightning as pl

    return type(cls.__name__, (cls, pl.LightningDataModule),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


class LabDataModule(Declared):
    """Base class: holds train/val/test datasets and builds their loaders.

    A data module declares what it is on the class; the config, the loop choice and the grid
    search read these declarations (``data.registry``), never its name:

    - ``Options``: a frozen dataclass of ``fields.option`` fields, its options' one declaration
      (type, default, range or choices); a subclass extends ``LabDataModule.Options``. The
      ``data`` config group is checked against it before any data loads, and the constructor
      builds it from its keyword arguments (``self.options``).
    - ``in_memory``: whole tensor sets served from the main process (the plain loop can train it);
      ``False``: rows are read or transformed one by one (Lightning's Trainer runs it).
    - ``validation_option``: the option that holds validation rows out of the training set
      (``map_grid_refit`` sets it to 0 to train on them); ``None``: validation rows are drawn apart.
    - ``images``: image inputs ``[C, H, W]`` that the affine augmentation can transform.
    - ``check_sizes(options)``: size limits against the data set, before any data loads.
    """

    @dataclass(frozen=True)
    class Options:
        """The options every data module takes."""

        batch_size: int = option(128, "int", low=1)
        eval_batch_size: int = option(512, "int", low=1)
        num_workers: int = option(0, "int", low=0)
        seed: int = option(0, "int", low=0)

    option_group = "data"  # ``read_options`` (``io.declare.Declared``): ``data.<option>`` in messages
    task: str = "classification"
    input_range: tuple[float, float] | None = None
    in_memory: ClassVar[bool] = False
    validation_option: ClassVar[str | None] = None
    images: ClassVar[bool] = False

    @classmethod
    def check_sizes(cls, options: Options) -> None:
        """Size limits of these options against the data set (``ValueError``); none by default."""

    def __new__(cls, *args, **kwargs):
        lightning = sys.modules.get("pytorch_lightning")
        if lightning is not None and not issubclass(cls, lightning.LightningDataModule):
            cls = _lightning_variant(cls)
        return super().__new__(cls)

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets (subclasses); Lightning calls it with ``stage``."""

    def prepare_data(self) -> None:
        """Download what ``setup`` needs (subclasses); called once before ``setup``."""

    def __init__(self, **options: Any):
        super().__init__()
        self.options = self.read_options(options)
        self.check_sizes(self.options)
        self.batch_size = self.options.batch_size
        self.eval_batch_size = self.options.eval_batch_size
        self.num_workers = self.options.num_workers
        self.seed = self.options.seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.target_mean: torch.Tensor | None = None
        self.target_std: torch.Tensor | None = None

    # --- to be provided by subclasses -------------------------------------------------
    input_shape: tuple[int, ...]
    num_outputs: int

    @property
    def n_train(self) -> int:
        self.setup("fit")
        return len(self.train_set)

    def ood_dataloaders(self) -> dict[str, DataLoader]:
        """Out-of-distribution test loaders; none by default."""
        return {}

    # --- loaders ----------------------------------------------------------------------
    def _loader(self, dataset: Dataset, shuffle: bool, batch_size: int | None = None) -> DataLoader:
        """In-memory tensors (``TensorDataset``, also under ``Subset``s) are served a batch at a time
        by tensor indexing (``TensorRows`` + ``BatchIndexSampler``: same batches, no per-row
        ``__getitem__`` and collate); other datasets row by row."""
        rows = TensorRows.of(dataset)
        if rows is not None:
            return DataLoader(
                rows, batch_size=None,
                sampler=BatchIndexSampler(len(rows), batch_size or self.eval_batch_size, shuffle, self.seed),
                num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
            )
        return DataLoader(
            dataset,
            batch_size=batch_size or self.eval_batch_size,
            sampler=EpochShuffleSampler(len(dataset), self.seed) if shuffle else None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def train_eval_dataloader(self, batch_size: int | None = None) -> DataLoader:
        """The training set in fixed order (for Laplace fits and marglik), not shuffled; batches of
        ``batch_size`` or ``eval_batch_size`` (the fit sums over data, so only speed and memory
        depend on it)."""
        return self._loader(self.train_set, shuffle=False, batch_size=batch_size or self.eval_batch_size)


def split_off_validation(dataset: Dataset, n_val: int, seed: int) -> tuple[Dataset, Dataset]:
    """Split ``dataset`` into (train, val) with ``n_val`` validation points, by a fixed seed."""
    if not 0 <= n_val < len(dataset):
        raise ValueError(f"data.n_val must be in [0, {len(dataset)}); got {n_val}")
    generator = torch.Generator().manual_seed(seed)
    train, val = random_split(dataset, [len(dataset) - n_val, n_val], generator=generator)
    return train, val
