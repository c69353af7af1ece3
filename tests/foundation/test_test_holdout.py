"""``data.test_holdout``: the Laplace Redux authors' test split (``random_split`` of the test set
with a generator seeded 42, the first k images left out), the MAP cache unaffected, bad values
refused before any work."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset, random_split

from laplace_lab.config.load import load_run_config
from laplace_lab.data import VisionDataModule
from laplace_lab.data.vision import TEST_HOLDOUT_SEED, hold_out_test
from laplace_lab.training.map_cache import cache_key
from tests.conftest import compose_config, run_config


def test_the_rest_is_the_authors_random_split_test_part():
    data = TensorDataset(torch.arange(100.0), torch.arange(100))
    kept = hold_out_test(data, 20)
    _, authors = random_split(data, (20, 80), generator=torch.Generator().manual_seed(TEST_HOLDOUT_SEED))
    assert list(kept.indices) == list(authors.indices) and len(kept) == 80
    assert hold_out_test(data, 0) is data


def test_mnist_keeps_8000_of_10000_and_leaves_the_ood_sets_whole(data_dir):
    dm = VisionDataModule(name="mnist", data_dir=str(data_dir), n_val=0, ood=["fashion_mnist"], test_holdout=2000)
    dm.setup("fit")
    full = VisionDataModule(name="mnist", data_dir=str(data_dir), n_val=0)
    full.setup("fit")
    assert len(dm.test_set) == 8000 and len(full.test_set) == 10000 and len(dm.train_set) == 60000
    first = dm.test_set.indices[0]
    assert torch.equal(dm.test_set[0][0], full.test_set[first][0])
    assert len(dm.ood_dataloaders()["fashion_mnist"].dataset) == 10000


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_values_are_refused_at_construction(bad):
    with pytest.raises(ValueError, match="data.test_holdout must be an integer >= 0"):
        VisionDataModule(name="fake_data", test_holdout=bad, download=False)


def test_a_holdout_that_leaves_nothing_is_refused():
    data = TensorDataset(torch.arange(5.0), torch.arange(5))
    with pytest.raises(ValueError, match=r"data.test_holdout=5 leaves no test image .* allowed: 0 to 4"):
        hold_out_test(data, 5)


def test_config_validation_names_the_option():
    with pytest.raises(ValueError, match="data.test_holdout"):
        load_run_config(compose_config(["data=mnist", "data.test_holdout=-5"]))


def test_the_holdout_shares_the_map_cache_entry():
    base = run_config(["experiment=redux_mnist", "method=la", "seed=0"])
    assert cache_key(base) == cache_key(run_config(["experiment=redux_mnist", "method=la", "seed=0",
                                                    "data.test_holdout=2000"]))


def test_the_cache_key_still_leaves_out_the_data_folder():
    """The run-only ``data.data_dir`` and the post-hoc-only ``data.test_holdout`` are both left out
    (one ``data`` entry must not replace the other)."""
    here = run_config(["experiment=redux_mnist", "method=la", "paths.data_dir=/a"])
    there = run_config(["experiment=redux_mnist", "method=la", "paths.data_dir=/b", "data.test_holdout=10"])
    assert here.data["data_dir"] != there.data["data_dir"] and cache_key(here) == cache_key(there)
