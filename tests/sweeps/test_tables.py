"""laplace_lab.tables on hand-made run folders with known values."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from laplace_lab import tables
from laplace_lab.sweeps.callback import SweepSummary, summarize, validate_aggregate

# method -> seed -> metrics; "B" has one seed without test/la/nll
VALUES = {
    ("mlp", "kron"): {0: {"test/map/acc": 0.91, "test/la/nll": 0.31}, 1: {"test/map/acc": 0.93, "test/la/nll": 0.27},
                      2: {"test/map/acc": 0.95, "test/la/nll": 0.2912345}},
    ("lenet", "diag"): {0: {"test/map/acc": 0.5, "test/la/nll": 1.25}, 1: {"test/map/acc": 0.75}},
}
HW = {"platform": "Linux-test", "cpu_count": 2, "torch": "9.9", "cuda_device": None}


def make_job(sweep: Path, model: str, curvature: str, seed: int, metrics: dict | None, state: str = "finished",
             wall: float = 1.0) -> Path:
    overrides = [f"model={model}", f"curvature={curvature}", f"seed={seed}", "logger=csv"]
    job = sweep / ",".join(sorted(overrides))
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    hydra = {"hydra": {"runtime": {"choices": {"model": model, "curvature": curvature, "logger": "csv"}},
                       "job": {"config": {"override_dirname": {"exclude_keys": ["logger"]}}}}}
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    config = {"seed": seed, "curvature": {"hessian_structure": curvature, "type": "ggn"}, "model": {"widths": [50]}}
    (job / "config_resolved.yaml").write_text(yaml.safe_dump(config))
    (job / "figures").mkdir()
    (job / "figures" / "reliability.png").write_bytes(f"png {model} {seed}".encode())
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps({**metrics, "time/fit_s": wall / 2}))
    status = {"state": state, "launch_id": "L1", "last_action": "ran", "wall_s": wall,
              "git": {"commit": "abc1234", "dirty": False}, "hardware": HW}
    (job / "status.json").write_text(json.dumps(status))
    return job


@pytest.fixture
def sweep(tmp_path) -> Path:
    sweep = tmp_path / "multirun"
    walls = iter(range(1, 100))
    for (model, curvature), seeds in VALUES.items():
        for seed, metrics in seeds.items():
            make_job(sweep, model, curvature, seed, metrics, wall=float(next(walls)))
    make_job(sweep, "mlp", "full", 0, None, state="failed")  # no metrics: not a run
    make_job(sweep, "mlp", "full", 1, {"test/map/acc": 0.0}, state="running")  # killed: not finished
    (sweep / "launches.jsonl").write_text(json.dumps({"launch_id": "L1", "command": "python -m laplace_lab.train -m x=1"}) + "\n")
    return sweep


def read_csv(path: Path) -> list[dict]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def test_means_standard_errors_and_n(sweep, tmp_path):
    md, csv_path = tables.aggregate([sweep], "toy", metrics=["test/map/acc", "test/la/nll"],
                                    results_dir=tmp_path / "results")
    assert md == tmp_path / "results" / "toy.md" and csv_path.suffix == ".csv"
    rows = {(r["model"], r["curvature"]): r for r in read_csv(csv_path)}
    assert set(rows) == set(VALUES)  # grouped by the overrides less seed and excluded keys (logger)
    for key, seeds in VALUES.items():
        row = rows[key]
        assert int(row["n"]) == len(seeds)
        for metric in ("test/map/acc", "test/la/nll"):
            values = [m[metric] for m in seeds.values() if metric in m]
            assert int(row[f"{metric} n"]) == len(values)
            assert abs(float(row[f"{metric} mean"]) - statistics.fmean(values)) < 1e-12
            if len(values) > 1:
                assert abs(float(row[f"{metric} se"]) - statistics.stdev(values) / math.sqrt(len(values))) < 1e-12
            else:
                assert math.isnan(float(row[f"{metric} se"]))
    assert rows[("mlp", "kron")]["seeds"] == "seed=0, seed=1, seed=2"


def test_markdown_rows_and_provenance_header(sweep, tmp_path):
    md, csv_path = tables.aggregate([sweep], "toy", metrics=["test/map/acc", "test/la/nll"],
                                    results_dir=tmp_path / "results")
    text = md.read_text()
    lines = text.splitlines()
    assert lines[0] == "# toy"
    assert "- commit: abc1234 (dirty: False)" in lines
    assert "- command (recorded at launch): python -m laplace_lab.train -m x=1" in lines
    assert "- seeds: seed: 0, 1, 2" in lines
    assert any(line.startswith("- hardware (recorded by the jobs): Linux-test, 2 CPUs, torch 9.9, device: CPU only")
               for line in lines)
    assert "- wall time: sum 15.0 s, max 5.0 s over 5 jobs" in text  # walls 1..5
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| model | curvature | n | test/map/acc | test/la/nll |"
    assert len(table) == 2 + len(VALUES)
    mlp = next(line for line in table if line.startswith("| mlp"))
    acc = VALUES[("mlp", "kron")]
    mean, se = statistics.fmean(m["test/map/acc"] for m in acc.values()), statistics.stdev(
        m["test/map/acc"] for m in acc.values()) / math.sqrt(3)
    assert f"| 3 | {mean:.4f} ± {se:.4f} |" in mlp
    lenet = next(line for line in table if line.startswith("| lenet"))
    assert lenet.endswith("| 1.2500 (n=1) |")  # one of the two seeds has test/la/nll
    assert csv_path.read_text().startswith("# table: toy\n# commit: abc1234")


def test_group_by_config_key_and_cli(sweep, tmp_path, capsys):
    out = tmp_path / "res"
    tables.main([str(sweep), "--name", "cli", "--metrics", "test/map/acc", "--group-by", "curvature.hessian_structure",
                 "model", "--results-dir", str(out)])
    assert str(out / "cli.md") in capsys.readouterr().out
    rows = read_csv(out / "cli.csv")
    assert {(r["model"], r["curvature.hessian_structure"]) for r in rows} == set(VALUES)


def test_reconstructed_command_and_errors(sweep, tmp_path):
    (sweep / "launches.jsonl").unlink()
    md, _ = tables.aggregate([sweep], "rec", metrics=["test/map/acc"], results_dir=tmp_path)
    assert "- command (reconstructed from the jobs' overrides): python -m laplace_lab.train -m " in md.read_text()
    assert "seed=0,1,2" in md.read_text()
    with pytest.raises(ValueError, match="in no run's metrics.json; allowed"):
        tables.aggregate([sweep], "bad", metrics=["test/nope"], results_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no finished runs"):
        tables.aggregate([tmp_path / "empty"], "x", results_dir=tmp_path)
    with pytest.raises(ValueError, match="allowed: \\['name', 'metrics'"):
        validate_aggregate({"name": "t", "metric": ["a"]})


def test_summary_classifies_jobs_of_the_launch(sweep):
    s = summarize(sweep, "L1")
    assert s["counts"] == {"finished": 5, "skipped": 0, "failed": 1, "unfinished": 1}
    assert summarize(sweep, "other")["counts"]["finished"] == 0


def test_figures_of_the_first_seed_are_copied_and_linked(sweep, tmp_path):
    md, _ = tables.aggregate([sweep], "fig", metrics=["test/map/acc"], figures=["reliability", "absent"],
                             results_dir=tmp_path / "r")
    copied = sorted((tmp_path / "r" / "fig_figures").iterdir())
    by_name = {p.name: p.read_bytes() for p in copied}
    assert by_name == {"model=mlp,curvature=kron__reliability.png": b"png mlp 0",
                       "model=lenet,curvature=diag__reliability.png": b"png lenet 0"}
    assert "![model=mlp,curvature=kron: reliability](fig_figures/model=mlp,curvature=kron__reliability.png)" in md.read_text()


def test_root_aggregate_key_is_validated_before_jobs_run(tmp_path):
    callback = SweepSummary()
    bad = OmegaConf.create({"aggregate": {"name": "t", "figure": ["x"]}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit):
        callback.on_multirun_start(bad)
    assert not (tmp_path / "launches.jsonl").exists()
    good = OmegaConf.create({"aggregate": {"name": "t", "figures": ["x"]}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(good)
    assert callback.aggregate == {"name": "t", "figures": ["x"]} and (tmp_path / "launches.jsonl").is_file()


def test_model_selection_section_in_markdown(sweep, tmp_path):
    spec = {"score": "test/map/acc", "candidates": ["model"], "within": ["seed"], "targets": ["test/la/nll"]}
    md, _ = tables.aggregate([sweep], "sel", metrics=["test/map/acc"], results_dir=tmp_path, model_selection=spec)
    text = md.read_text()
    assert "## Model selection by marginal likelihood" in text
    # seed 0: mlp acc 0.91 > lenet 0.5 and mlp nll 0.31 < lenet 1.25: same order, tau +1
    section = text.split("### seed=0")[1].split("###")[0]
    assert "tau 1.0000, best agrees: True" in section
    with pytest.raises(ValueError, match="model_selection has unknown keys"):
        validate_aggregate({"name": "t", "model_selection": {**spec, "typo": 1}})


def test_cli_preset_takes_the_aggregate_block(sweep, tmp_path, capsys):
    out = tmp_path / "res"
    tables.main([str(sweep), "--preset", "redux_mnist", "--name", "from_preset", "--metrics", "test/map/acc",
                 "--results-dir", str(out)])
    assert str(out / "from_preset.md") in capsys.readouterr().out
    rows = read_csv(out / "from_preset.csv")
    assert rows and set(rows[0]) >= {"method_name", "n"}  # the preset's group_by
    assert tables.preset_spec("immer2021_images")["model_selection"]["score"]
    with pytest.raises(ValueError, match="allowed: .*redux_mnist"):
        tables.preset_spec("no_such_preset")
