"""Optional OOD sets are looked for on disk only: a missing one is never downloaded, is reported in
one warning line (or one error naming every missing set), and is not looked for at all when the
evaluation does not read it (``evaluation.ood.enabled=false``, ``evaluation.ood.datasets``)."""

from __future__ import annotations

import logging

import pytest

from laplace_lab.training.build import build, ood_sets_used
from laplace_lab.training.loops import PLAIN
from tests.conftest import run_config


@pytest.fixture
def no_download(monkeypatch):
    """Any torchvision download fails the test (the URL error the offline user saw)."""
    import torchvision.datasets.mnist as tv_mnist

    def download(*args, **kwargs):
        raise AssertionError("an OOD set was downloaded")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", download)
    monkeypatch.setattr(tv_mnist, "download_url", download, raising=False)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_missing_ood_sets_are_reported_once_in_one_line(tmp_path, no_download, caplog):
    from laplace_lab.data.vision import VisionDataModule

    with caplog.at_level(logging.INFO):
        dm = VisionDataModule(name="fake_data", data_dir=str(tmp_path), n_val=25, fake_size=128,
                              ood=["kmnist", "fake_data", "emnist"])
    assert dm.ood_names == ["fake_data"] and dm.ood_skipped == ["kmnist", "emnist"]
    (line,) = _warnings(caplog)
    assert "\n" not in line and "kmnist, emnist" in line and "data.ood_if_missing=skip" in line
    assert list(tmp_path.iterdir()) == []  # nothing created in the data folder


def test_missing_ood_sets_with_if_missing_error_name_every_set(tmp_path, no_download):
    from laplace_lab.data.vision import VisionDataModule

    with pytest.raises(FileNotFoundError, match=r"OOD set\(s\) \['kmnist', 'emnist'\] not found .*KMNIST/raw/"
                                                 r".*EMNIST/raw/.*data.ood_if_missing=skip"):
        VisionDataModule(name="fake_data", data_dir=str(tmp_path), n_val=25, fake_size=128,
                         ood=["kmnist", "emnist"], ood_if_missing="error")


@pytest.mark.parametrize("overrides,expected", [
    ([], ["fashion_mnist", "kmnist", "emnist"]),
    (["evaluation.ood.enabled=false"], []),
    (["evaluation=none"], []),
    (["evaluation.ood.datasets=[fashion_mnist]"], ["fashion_mnist"]),
])
def test_only_the_ood_sets_the_evaluation_reads_are_looked_for(overrides, expected):
    assert ood_sets_used(run_config(["data=mnist", *overrides])) == expected


def test_toy_data_has_no_ood_list():
    assert ood_sets_used(run_config([])) is None


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_without_ood_evaluation_does_not_look_for_the_sets(tmp_path, no_download, caplog, enabled):
    run = run_config(["data=fake_data", "data.ood=[kmnist,emnist]", f"paths.data_dir={tmp_path}",
                      f"evaluation.ood.enabled={str(enabled).lower()}", "logger=csv"])
    with caplog.at_level(logging.INFO):
        datamodule, _ = build(run, loop=PLAIN)
    assert datamodule.ood_skipped == (["kmnist", "emnist"] if enabled else [])
    assert len(_warnings(caplog)) == (1 if enabled else 0)
