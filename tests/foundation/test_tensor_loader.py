"""In-memory datasets are served a batch at a time by tensor indexing (``data.base.TensorRows``):
the batches equal those of a ``DataLoader`` that indexes row by row and collates, epoch by epoch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from laplace_lab.data.base import (
    EpochShuffleSampler,
    LabDataModule,
    TensorRows,
    split_off_validation,
)


def _row_by_row(dataset, shuffle, batch_size, seed):
    sampler = EpochShuffleSampler(len(dataset), seed) if shuffle else None
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler


def _module(seed=3):
    dm = LabDataModule(batch_size=7, eval_batch_size=5, seed=seed)
    X, y = torch.randn(40, 2, 3), torch.randint(0, 4, (40,))
    full = TensorDataset(X, y)
    train, dm.val_set = split_off_validation(full, 9, seed=1)  # Subsets of the TensorDataset
    dm.train_set = Subset(train, range(26))  # a Subset of a Subset
    dm.test_set = full
    return dm


@pytest.mark.parametrize("which", ["train", "val", "test", "train_eval"])
def test_batches_equal_the_row_by_row_loader(which):
    dm = _module()
    dataset = {"train": dm.train_set, "val": dm.val_set, "test": dm.test_set, "train_eval": dm.train_set}[which]
    loader = {"train": dm.train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader,
              "train_eval": dm.train_eval_dataloader}[which]()
    assert isinstance(loader.dataset, TensorRows)
    batch_size = 7 if which == "train" else 5
    reference, ref_sampler = _row_by_row(dataset, which == "train", batch_size, dm.seed)
    assert len(loader) == len(reference) == -(-len(dataset) // batch_size)
    for epoch in range(3):  # Lightning calls set_epoch on the loader's sampler every epoch
        for s in (loader.sampler, ref_sampler):
            if s is not None:
                s.set_epoch(epoch)
        got, want = list(loader), list(reference)
        assert len(got) == len(want)
        for (x, y), (xr, yr) in zip(got, want):
            assert torch.equal(x, xr) and torch.equal(y, yr) and y.dtype == yr.dtype
    if which == "train":  # the order is drawn at the first batch: set_epoch after iter() still counts
        it = iter(loader)
        loader.sampler.set_epoch(5)
        ref_sampler.set_epoch(5)
        assert torch.equal(next(it)[1], next(iter(reference))[1])
    if which == "train":  # another epoch, another order
        loader.sampler.set_epoch(0)
        first = torch.cat([y for _, y in loader])
        loader.sampler.set_epoch(1)
        assert not torch.equal(first, torch.cat([y for _, y in loader]))


def test_batches_are_copies_and_other_datasets_go_row_by_row():
    dm = _module()
    x, _ = next(iter(dm.test_dataloader()))
    x.add_(1.0)  # an in-place change of a batch must not reach the data set
    assert torch.equal(next(iter(dm.test_dataloader()))[0], dm.test_set.tensors[0][:5])

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i

    assert TensorRows.of(Rows()) is None
    dm.test_set = Rows()
    batches = list(dm.test_dataloader())
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3, 4], [5]]
