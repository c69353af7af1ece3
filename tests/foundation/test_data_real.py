"""Real data from LAPLACE_LAB_DATA_DIR: counts, shapes and standardisation."""

from __future__ import annotations

import torch

from laplace_lab.data import UCIDataModule, VisionDataModule


def test_mnist_counts_and_shapes(data_dir):
    dm = VisionDataModule(name="mnist", data_dir=str(data_dir), n_val=5000, ood=["fashion_mnist"], ood_if_missing="error")
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (55000, 5000, 10000)
    x, y = dm.test_set[0]
    assert x.shape == (1, 28, 28) and 0 <= x.min() and x.max() <= 1 and y.dtype == torch.long
    ood = dm.ood_dataloaders()["fashion_mnist"]
    assert len(ood.dataset) == 10000
    # The validation split is fixed by the seed.
    again = VisionDataModule(name="mnist", data_dir=str(data_dir), n_val=5000)
    again.setup("fit")
    assert torch.equal(dm.val_set[0][0], again.val_set[0][0])


def test_uci_yacht_split(data_dir):
    dm = UCIDataModule(name="yacht", split=0, data_dir=str(data_dir), val_fraction=0.1)
    # yacht: 308 rows, split 0 has 277 train / 31 test rows; 10% of train held out.
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (249, 28, 31)
    X, y = dm.train_set.tensors
    assert X.shape == (249, 6) and y.shape == (249, 1)
    assert torch.allclose(X.mean(0), torch.zeros(6), atol=1e-5) and torch.allclose(y.std(0, unbiased=False), torch.ones(1), atol=1e-4)
    assert dm.n_splits == 20
