"""A preset is one folder, ``experiments/<preset>/`` (``laplace_lab.config.presets``): Hydra composes
``experiment=<preset>`` from it exactly as from the one file ``conf/experiment/<preset>.yaml`` of
before, its smoke variant cuts it, and a new preset needs three files in a new folder and nothing else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from laplace_lab.config import CONF_DIR
from laplace_lab.config.presets import EXPERIMENTS_DIR, SCHEME, preset_names, preset_path
from laplace_lab.reporting import preset_table, tables
from laplace_lab.reporting import reference as ref
from laplace_lab.reporting.table_spec import Admission, TableSpec

PRESETS = preset_names()


def _compose(overrides: list[str]) -> str:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_yaml(compose("train", overrides=overrides))


def test_the_folders_are_the_presets():
    assert len(PRESETS) >= 18 and {"redux_mnist", "toy2d", "immer2021_images_peer_cut"} <= set(PRESETS)
    for name in PRESETS:
        folder = EXPERIMENTS_DIR / name
        assert (folder / "README.md").is_file(), f"{folder}: no README.md"
        assert yaml.safe_load((folder / "preset.yaml").read_text())["experiment_name"] in (name, None)
    assert not (CONF_DIR / "experiment").exists(), "presets live in experiments/<preset>/, not conf/experiment/"
    with pytest.raises(ValueError, match=r"preset 'nope' does not exist .* allowed: \[.*'redux_mnist'"):
        preset_path("nope")


def _same_as_one_file_layout(tmp_path: Path, names: list[str]) -> None:
    """experiment=<p> from its folder == from a conf/experiment/<p>.yaml copy of the same file (the
    layout before): the same job config, key for key."""
    old = tmp_path / "experiment"
    old.mkdir()
    for name in PRESETS:
        shutil.copy(EXPERIMENTS_DIR / name / "preset.yaml", old / f"{name}.yaml")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in names:
            now = OmegaConf.to_yaml(compose("train", overrides=[f"experiment={name}"]))
            before = OmegaConf.to_yaml(compose("train", overrides=[f"hydra.searchpath=[file://{tmp_path}]",
                                                                   f"experiment={name}"]))
            assert now == before, name


def test_a_preset_composes_as_from_the_one_file_layout(tmp_path):
    _same_as_one_file_layout(tmp_path, ["eschenhagen2021_mnist_cpu"])  # its defaults name another preset


@pytest.mark.slow  # 36 compositions: about 10 s of CPU
def test_each_preset_composes_as_from_the_one_file_layout(tmp_path):
    _same_as_one_file_layout(tmp_path, PRESETS)


@pytest.mark.slow  # 36 compositions
def test_smoke_variants_cut_the_preset_and_say_so():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in PRESETS:
            full = compose("train", overrides=[f"experiment={name}"], return_hydra_config=True)
            smoke = compose("train", overrides=[f"experiment={name}/smoke"], return_hydra_config=True)
            assert smoke.experiment_name == f"{name}_smoke" and smoke.aggregate.name == f"{name}_smoke", name
            assert smoke.trainer.max_epochs <= full.trainer.max_epochs, name
            seeds = str(smoke.hydra.sweeper.params.get("seed", smoke.hydra.sweeper.params.get("data.split")))
            assert "," not in seeds, f"{name}/smoke runs more than one seed: {seeds}"
            assert preset_table.sweep_size(dict(smoke.hydra.sweeper.params)) <= 4, name


def test_a_new_preset_is_three_files_in_one_folder(tmp_path, monkeypatch):
    """A dummy preset in a folder of its own (a temporary experiments/, nothing else written):
    experiment=dummy composes, its smoke variant too, its reference file is found, `tables --preset`
    reads its aggregate block, and the README table has its row."""
    root = tmp_path / "experiments"
    shutil.copytree(EXPERIMENTS_DIR / "toy2d", root / "toy2d", ignore=shutil.ignore_patterns("smoke.yaml"))
    folder = root / "dummy"
    folder.mkdir()
    (folder / "preset.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: sinusoid\n\nexperiment_name: dummy\n"
        "trainer:\n  max_epochs: 7\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      seed: 0,1,2\n"
        "aggregate:\n  name: dummy\n  metrics: [test/map/nll]\n")
    (folder / "reference.yaml").write_text(yaml.safe_dump({
        "format": 2, "preset": "dummy", "paper": "Dummy et al. 2024, A Paper (Venue)",
        "references": [{"id": "nll", "kind": "paper", "row": {"method_name": "la"}, "metric": "test/map/nll", "printed": "0.5",
                        "tolerance": 0.1, "tolerance_reason": "none printed",
                        "source": {"paper": "Dummy et al. 2024", "where": "Table 1", "row": "LA", "column": "NLL",
                                   "read_from": "the PDF"}}]}))
    (folder / "README.md").write_text("# Dummy et al. 2024\n\nWhat it reproduces.\n")
    search = f"hydra.searchpath=[{SCHEME}://{root}]"
    cfg = yaml.safe_load(_compose([search, "experiment=dummy"]))
    assert cfg["experiment_name"] == "dummy" and cfg["trainer"]["max_epochs"] == 7
    assert cfg["data"]["_target_"].endswith("Sinusoid") or "sinusoid" in str(cfg["data"]).lower()
    assert [f["path"] for f in ref.find_references("dummy", root)] == [folder / "reference.yaml"]
    monkeypatch.setattr(tables, "EXPERIMENTS_DIR", root)
    assert tables.preset_spec("dummy")["name"] == "dummy"
    rows = {p.name: p for p in preset_table.load_presets(root)}
    assert set(rows) == {"dummy", "toy2d"} and rows["dummy"].sweep_jobs == 3 and rows["dummy"].smoke is None
    assert preset_table.row(rows["dummy"], tmp_path, {}) == \
        "| [`dummy`](experiments/dummy/) | Dummy et al. 2024 | 3 | not run | - | - |"
    # the optional fourth file
    (folder / "smoke.yaml").write_text("# @package _global_\n# Measured: 3 s\ndefaults:\n  - /experiment/dummy\n"
                                       "  - _self_\nexperiment_name: dummy_smoke\ntrainer:\n  max_epochs: 1\n")
    smoke = yaml.safe_load(_compose([search, "experiment=dummy/smoke"]))
    assert smoke["experiment_name"] == "dummy_smoke" and smoke["trainer"]["max_epochs"] == 1
    assert preset_table.smoke_cell(folder) == "`dummy/smoke` (3 s)"
    (folder / "README.md").unlink()
    with pytest.raises(preset_table.PresetFolderError, match=r"dummy/README.md: missing"):
        preset_table.load_presets(root)


def test_smoke_jobs_are_never_committed(tmp_path, monkeypatch):
    sweep = tmp_path / "multirun"
    job = sweep / "seed=0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=0", "data.kind=linear"]))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"runtime": {"choices": {"experiment": "toy2d/smoke"}}}}))
    (job / "config_resolved.yaml").write_text(yaml.safe_dump({"seed": 0, "method_name": "kron"}))
    (job / "metrics.json").write_text('{"test/map/acc": 0.9}')
    (job / "status.json").write_text('{"state": "finished", "launch_id": "L1", "wall_s": 1.0, '
                                     '"git": {"commit": "abc", "dirty": false, "ignored_checked": true}}')
    monkeypatch.setattr(tables, "COMMITTED_RESULTS", tmp_path / "results")
    with pytest.raises(tables.ProvenanceError, match=r"1 job\(s\) ran a smoke variant .* not a reproduction"):
        tables.aggregate([sweep], "toy2d", spec=TableSpec(metrics=["test/map/acc"]), preset="toy2d",
                         commit_results=True, admission=Admission(allow_mixed=True))
    with pytest.raises(tables.ProvenanceError, match="is a smoke variant"):
        tables.aggregate([sweep], "toy2d", spec=TableSpec(metrics=["test/map/acc"]), preset="toy2d/smoke",
                         commit_results=True, admission=Admission(allow_mixed=True))
    out = tables.aggregate([sweep], "toy2d_smoke",
                           spec=TableSpec(metrics=["test/map/acc"], group_by=["data.kind", "method_name"]),
                           results_dir=tmp_path / "t", preset="toy2d/smoke",
                           admission=Admission(allow_mixed=True, allow_mixed_launches=True))
    text = out[0].read_text()
    assert "## SMOKE RUN: not a reproduction" in text and "experiments/toy2d/reference.yaml" in text
    assert not (tmp_path / "results").exists()


def test_the_readme_table_has_a_row_per_preset():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index(preset_table.BEGIN):readme.index(preset_table.END)]
    for name in PRESETS:
        assert f"[`{name}`](experiments/{name}/)" in table and f"`{name}/smoke`" in table, name
