"""laplace_lab.reporting.tables on hand-made run folders with known values."""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from laplace_lab.reporting import provenance, tables
from laplace_lab.reporting.sweep_table import SweepTable, validate_aggregate
from laplace_lab.reporting.table_spec import Admission, TableSpec
from laplace_lab.sweeps.callback import SweepSummary, summarize

REAL_EXPERIMENTS = Path(tables.__file__).resolve().parents[3] / "experiments"

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
              "git": {"commit": "abc1234", "dirty": False, "ignored_checked": True}, "hardware": HW}
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


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_files(repo: Path, files: dict[str, str], message: str = "c") -> str:
    """Write ``files`` into ``repo`` (initialised on first use), commit them; the new commit's sha."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def set_git(job: Path, commit: str, dirty: bool = False, **extra) -> None:
    status = json.loads((job / "status.json").read_text())
    status["git"] = {"commit": commit, "dirty": dirty, "ignored_checked": True, **extra}
    (job / "status.json").write_text(json.dumps(status))


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A tiny git repository standing in for this one (commit checks and reference files)."""
    root = tmp_path / "repo"
    commit_files(root, {"README": "x\n"})
    monkeypatch.setattr(provenance, "REPO_ROOT", root)
    monkeypatch.setattr(tables, "EXPERIMENTS_DIR", root / "experiments")
    monkeypatch.setattr(tables, "COMMITTED_RESULTS", root / "results")
    for preset in sorted(REAL_EXPERIMENTS.glob("*/preset.yaml")):  # this repository's presets, untracked
        (root / "experiments" / preset.parent.name).mkdir(parents=True)
        shutil.copy(preset, root / "experiments" / preset.parent.name / "preset.yaml")
    return root


@pytest.fixture
def preset_t(monkeypatch) -> str:
    """A stand-in preset "t" whose table is t (``commit_results`` writes only a preset's own table); it is
    in no commit, so its tables need ``allow_mixed``."""
    monkeypatch.setattr(tables, "preset_spec", lambda preset, real=tables.preset_spec: {"name": "t"} if preset == "t"
                        else real(preset))
    return "t"


def finished_jobs(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.rglob("status.json") if json.loads(p.read_text())["state"] == "finished")


def read_csv(path: Path) -> list[dict]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def test_means_standard_errors_and_n(sweep, tmp_path):
    md, csv_path, jobs = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]),
                                          results_dir=tmp_path / "results")
    assert md == tmp_path / "results" / "toy.md" and csv_path.suffix == ".csv" and jobs.name == "toy.jobs.csv"
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
    md, csv_path, _ = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]),
                                       results_dir=tmp_path / "results")
    text = md.read_text()
    lines = text.splitlines()
    assert lines[0] == "# toy"
    assert "- commit: abc1234 (dirty: False)" in lines
    assert "- clean at job start: no modified, untracked or ignored package files" in lines
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
    md, *_ = tables.aggregate([sweep], "rec", spec=TableSpec(metrics=["test/map/acc"]), results_dir=tmp_path)
    assert "- command (reconstructed from the jobs' overrides): python -m laplace_lab.train -m " in md.read_text()
    assert "seed=0,1,2" in md.read_text()
    with pytest.raises(ValueError, match="in no run's metrics.json; allowed"):
        tables.aggregate([sweep], "bad", spec=TableSpec(metrics=["test/nope"]), results_dir=tmp_path)
    md, csv_path, _ = tables.aggregate([sweep], "omit",
                                       spec=TableSpec(metrics=["test/map/acc", "test/nope"], absent_metrics="omit"),
                                       results_dir=tmp_path)
    assert "## Metrics left out (in no run's metrics.json)\n\n`test/nope`" in md.read_text()
    assert "test/nope" not in csv_path.read_text()
    with pytest.raises(ValueError, match="absent_metrics='drop'; allowed: \\['error', 'omit'\\]"):
        tables.aggregate([sweep], "bad", spec=TableSpec(metrics=["test/map/acc"], absent_metrics="drop"),
                         results_dir=tmp_path)
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
    md, *_ = tables.aggregate([sweep], "fig",
                              spec=TableSpec(metrics=["test/map/acc"], figures=["reliability", "absent"]),
                              results_dir=tmp_path / "r")
    copied = sorted((tmp_path / "r" / "fig_figures").iterdir())
    by_name = {p.name: p.read_bytes() for p in copied}
    assert by_name == {"model=mlp,curvature=kron__reliability.png": b"png mlp 0",
                       "model=lenet,curvature=diag__reliability.png": b"png lenet 0"}
    assert "![model=mlp,curvature=kron: reliability](fig_figures/model=mlp,curvature=kron__reliability.png)" in md.read_text()


def test_root_aggregate_key_is_validated_before_jobs_run(tmp_path):
    callback = SweepSummary(aggregator=SweepTable())
    bad = OmegaConf.create({"aggregate": {"name": "t", "figure": ["x"]}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit):
        callback.on_multirun_start(bad)
    assert not (tmp_path / "launches.jsonl").exists()
    good = OmegaConf.create({"aggregate": {"name": "t", "figures": ["x"]}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(good)
    assert callback.aggregate == {"name": "t", "figures": ["x"]} and (tmp_path / "launches.jsonl").is_file()


def test_model_selection_section_in_markdown(sweep, tmp_path):
    spec = {"score": "test/map/acc", "candidates": ["model"], "within": ["seed"], "targets": ["test/la/nll"]}
    md, *_ = tables.aggregate([sweep], "sel", spec=TableSpec(metrics=["test/map/acc"], model_selection=spec),
                              results_dir=tmp_path)
    text = md.read_text()
    assert "## Model selection by marginal likelihood" in text
    # seed 0: mlp acc 0.91 > lenet 0.5 and mlp nll 0.31 < lenet 1.25: same order, tau +1
    section = text.split("### seed=0")[1].split("###")[0]
    assert "tau 1.0000, best agrees: True" in section
    with pytest.raises(ValueError, match="model_selection has unknown keys"):
        validate_aggregate({"name": "t", "model_selection": {**spec, "typo": 1}})


def test_cli_preset_takes_the_aggregate_block(sweep, tmp_path, capsys, repo):
    sha = commit_files(repo, {"experiments/redux_mnist/preset.yaml": (repo / "experiments" / "redux_mnist" /
                                                                      "preset.yaml").read_text()})
    for job in finished_jobs(sweep):
        set_git(job, sha)
    out = tmp_path / "res"
    tables.main([str(sweep), "--preset", "redux_mnist", "--name", "from_preset", "--metrics", "test/map/acc",
                 "--results-dir", str(out)])
    assert str(out / "from_preset.md") in capsys.readouterr().out
    rows = read_csv(out / "from_preset.csv")
    assert rows and set(rows[0]) >= {"method_name", "n"}  # the preset's group_by
    assert tables.preset_spec("immer2021_images")["model_selection"]["score"]
    with pytest.raises(ValueError, match="allowed: .*redux_mnist"):
        tables.preset_spec("no_such_preset")


# --- provenance: one clean commit containing the preset, one launch command -----------------------------


def test_refuses_jobs_from_two_commits_unless_allow_mixed(sweep, tmp_path, repo):
    a = commit_files(repo, {"experiments/toy/preset.yaml": "a: 1\n"})
    b = commit_files(repo, {"experiments/toy/preset.yaml": "a: 2\n"})
    jobs = finished_jobs(sweep)
    for job in jobs:
        set_git(job, a)
    set_git(jobs[0], b)
    with pytest.raises(tables.ProvenanceError, match=r"refusing to write table 'toy': the jobs come from 2 commits: "
                                                      rf"{a} \(4 jobs\), {b} \(1 job\).*--allow-mixed"):
        tables.aggregate([sweep], "toy", preset="toy", results_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # nothing written
    md, csv_path, _ = tables.aggregate([sweep], "toy", preset="toy", results_dir=tmp_path / "r",
                                       admission=Admission(allow_mixed=True))
    text = md.read_text()
    assert "- provenance: NOT ONE CLEAN COMMIT" in text and "the jobs come from 2 commits" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| model | curvature | n | commits |")
    rows = {r["model"]: r["commits"] for r in read_csv(csv_path)}
    mixed = "lenet" if "model=lenet" in jobs[0].name else "mlp"  # the group of the job at commit b
    assert rows[mixed] == ", ".join(sorted([a[:12], b[:12]]))
    assert rows[{"lenet": "mlp", "mlp": "lenet"}[mixed]] == a[:12]


def test_refuses_dirty_or_unchecked_jobs(sweep, tmp_path, repo):
    sha = commit_files(repo, {"experiments/toy/preset.yaml": "a: 1\n"})
    jobs = finished_jobs(sweep)
    for job in jobs:
        set_git(job, sha)
    tables.aggregate([sweep], "ok", preset="toy", results_dir=tmp_path / "r")  # clean: writes
    set_git(jobs[1], sha, dirty=True, dirty_files=["!! src/laplace_lab/data/uci.py"])
    with pytest.raises(tables.ProvenanceError, match=rf"1 job\(s\) ran from a dirty .*{jobs[1].name}.*uci.py"):
        tables.aggregate([sweep], "toy", preset="toy", results_dir=tmp_path / "r")
    set_git(jobs[1], sha)
    status = json.loads((jobs[2] / "status.json").read_text())
    status["git"] = {"commit": sha, "dirty": False}  # recorded before ignored files were checked
    (jobs[2] / "status.json").write_text(json.dumps(status))
    with pytest.raises(tables.ProvenanceError, match="without checking the ignored files"):
        tables.aggregate([sweep], "toy", preset="toy", results_dir=tmp_path / "r")


def test_refuses_a_commit_without_the_preset(sweep, tmp_path, repo):
    before = commit_files(repo, {"experiments/other/preset.yaml": "a: 1\n"})
    commit_files(repo, {"experiments/toy/preset.yaml": "a: 1\n"})
    for job in finished_jobs(sweep):
        set_git(job, before)
    with pytest.raises(tables.ProvenanceError, match=rf"commit {before} does not contain experiments/toy/preset.yaml"):
        tables.aggregate([sweep], "toy", preset="toy", results_dir=tmp_path / "r")
    tables.aggregate([sweep], "toy", preset="other", results_dir=tmp_path / "r")  # it has that one


def test_git_state_sees_ignored_package_files_but_not_caches(tmp_path):
    from laplace_lab.sweeps.status import git_state

    root = tmp_path / "repo"
    commit_files(root, {".gitignore": "data/\n__pycache__/\n*.egg-info/\n*.local.yaml\n",
                        "src/laplace_lab/a.py": "x = 1\n", "conf/train.yaml": "a: 1\n"})
    state = git_state(root)
    assert state["dirty"] is False and state["ignored_checked"] and len(state["commit"]) == 40
    (root / "src/laplace_lab/__pycache__").mkdir()
    (root / "src/laplace_lab/__pycache__/a.cpython-312.pyc").write_bytes(b"\0")
    (root / "src/laplace_lab.egg-info").mkdir()
    (root / "src/laplace_lab.egg-info/PKG-INFO").write_text("x")
    (root / "data").mkdir()
    (root / "data/big.csv").write_text("x")  # ignored, outside the package: not part of the code
    assert git_state(root)["dirty"] is False
    (root / "src/laplace_lab/data").mkdir()
    (root / "src/laplace_lab/data/uci.py").write_text("x = 2\n")  # ignored by data/, but package code
    state = git_state(root)
    assert state["dirty"] is True and state["dirty_files"] == ["!! src/laplace_lab/data/uci.py"]
    (root / "src/laplace_lab/data/uci.py").unlink()
    (root / "conf/my.local.yaml").write_text("a: 2\n")
    assert git_state(root)["dirty_files"] == ["!! conf/my.local.yaml"]
    (root / "conf/my.local.yaml").unlink()
    (root / "conf/train.yaml").write_text("a: 3\n")
    assert git_state(root)["dirty_files"] == [" M conf/train.yaml"]
    assert git_state(tmp_path / "not_a_repo")["dirty"] is None


def test_git_state_leaves_ones_own_untracked_folder_out(tmp_path):
    """An untracked scratch/ (the user's own scripts) does not mark the tree dirty; untracked files
    the runs can read do: in the package or its configs, and .py files at the top level."""
    from laplace_lab.sweeps.status import git_state

    root = tmp_path / "repo"
    commit_files(root, {"src/laplace_lab/a.py": "x = 1\n", "conf/train.yaml": "a: 1\n", "README.md": "r\n"})
    (root / "scratch" / "deep").mkdir(parents=True)
    (root / "scratch" / "deep" / "try.py").write_text("import laplace_lab\n")
    (root / "notes.md").write_text("mine\n")
    assert git_state(root)["dirty"] is False
    for path in ("src/laplace_lab/new.py", "conf/experiment/mine.yaml", "experiments/mine/preset.yaml",
                 "experiments/mine/smoke.yaml", "laplace_helper.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x = 2\n")
        state = git_state(root)
        assert state["dirty"] is True and state["dirty_files"] == [f"?? {path}"], path
        (root / path).unlink()
    (root / "README.md").write_text("changed\n")  # a tracked file, outside the package: dirty
    assert git_state(root)["dirty_files"] == [" M README.md"]


def test_refuses_jobs_of_different_launch_commands(sweep, tmp_path):
    jobs = finished_jobs(sweep)
    launches = [{"launch_id": "L1", "command": "python -m laplace_lab.train -m x=1 torch_num_threads=1", "cwd": "/a"},
                {"launch_id": "L2", "command": "python -m laplace_lab.train -m x=1 logger=csv hydra/launcher=ray",
                 "cwd": "/a"},
                {"launch_id": "L3", "command": "python -m laplace_lab.train -m x=2", "cwd": "/a"}]
    (sweep / "launches.jsonl").write_text("".join(json.dumps(line) + "\n" for line in launches))
    status = json.loads((jobs[0] / "status.json").read_text())
    (jobs[0] / "status.json").write_text(json.dumps({**status, "launch_id": "L2"}))
    tables.aggregate([sweep], "same", results_dir=tmp_path / "r")  # run-only overrides do not count
    (jobs[0] / "status.json").write_text(json.dumps({**status, "launch_id": "L3"}))
    with pytest.raises(tables.ProvenanceError, match=r"launched by 2 different commands: \[x=1\] \(4 jobs\); "
                                                      r"\[x=2\] \(1 job\).*--allow-mixed-launches"):
        tables.aggregate([sweep], "mixed", results_dir=tmp_path / "r")
    md, *_ = tables.aggregate([sweep], "mixed", results_dir=tmp_path / "r",
                              admission=Admission(allow_mixed_launches=True))
    text = md.read_text()  # one clean commit: the header says so, and names the launches apart
    assert "- launches: one clean commit, several launch commands" in text and "launched by 2 different commands" in text
    assert "NOT ONE CLEAN COMMIT" not in text and "clean at job start" in text and "| commits |" not in text


# --- the jobs CSV, where tables go, no machine paths ------------------------------------------------------


def test_jobs_csv_has_one_row_per_job(sweep, tmp_path):
    *_, jobs_path = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]),
                                     results_dir=tmp_path / "r")
    assert jobs_path.read_text().startswith("# table: toy\n")
    rows = read_csv(jobs_path)
    assert list(rows[0]) == ["job", "model", "curvature", "overrides", "command", "commit", "dirty", "wall_s",
                             "test/map/acc", "test/la/nll"]
    assert len(rows) == sum(len(s) for s in VALUES.values())
    for row in rows:
        job = sweep / Path(row["job"]).relative_to("multirun")
        metrics = json.loads((job / "metrics.json").read_text())
        status = json.loads((job / "status.json").read_text())
        assert row["overrides"] == " ".join(yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        assert row["command"] == "python -m laplace_lab.train -m x=1"  # the launch that ran it (L1)
        assert row["commit"] == "abc1234" and row["dirty"] == "False"
        assert float(row["wall_s"]) == status["wall_s"]
        assert float(row["test/map/acc"]) == metrics["test/map/acc"]
        assert row["test/la/nll"] == (repr(metrics["test/la/nll"]) if "test/la/nll" in metrics else "")


def test_a_resumed_job_counts_its_earlier_launches(sweep, tmp_path):
    """A job resumed from a checkpoint (checkpoint.resume_from=last): its wall time is its last
    launch's plus the training seconds before the checkpoint (checkpoint/resumed_fit_s)."""
    job = next(p for p in sorted(sweep.iterdir()) if (p / "metrics.json").is_file()
               and json.loads((p / "status.json").read_text())["state"] == "finished")
    metrics = json.loads((job / "metrics.json").read_text())
    (job / "metrics.json").write_text(json.dumps({**metrics, "checkpoint/resumed_fit_s": 1000.0}))
    wall = json.loads((job / "status.json").read_text())["wall_s"]
    md, *_, jobs_path = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]),
                                         results_dir=tmp_path / "r")
    row = next(r for r in read_csv(jobs_path) if sweep / Path(r["job"]).relative_to("multirun") == job)
    assert float(row["wall_s"]) == wall + 1000.0
    assert "checkpoint/resumed_fit_s" in md.read_text()


def test_tables_go_to_the_sweep_folder_and_results_only_with_commit_results(sweep, tmp_path, repo, preset_t):
    paths = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]))
    assert [p.parent for p in paths] == [sweep] * 3
    with pytest.raises(ValueError, match="holds the committed tables: write there only with --commit-results"):
        tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]), results_dir=repo / "results")
    with pytest.raises(ValueError, match="either results_dir"):
        tables.aggregate([sweep], "toy", results_dir=tmp_path, commit_results=True)
    with pytest.raises(ValueError, match="--commit-results needs --preset"):  # the command line's rule
        tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]), commit_results=True)
    with pytest.raises(ValueError, match=r"--name 'toy' with --commit-results: preset 't' writes results/t\.\*"):
        tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]), commit_results=True, preset=preset_t)
    assert not (repo / "results").exists()
    paths = tables.aggregate([sweep], "t", spec=TableSpec(metrics=["test/map/acc"]), commit_results=True,
                             preset=preset_t, admission=Admission(allow_mixed=True))
    assert [p.parent for p in paths] == [repo / "results"] * 3


def test_header_has_no_absolute_paths(sweep, tmp_path):
    cwd = tmp_path / "work"
    launch = {"launch_id": "L1", "cwd": str(cwd),
              "command": f"python -m laplace_lab.train -m x=1 paths.output_root={cwd / 'outputs'} "
                         f"paths.data_dir=/somewhere/else/data"}
    (sweep / "launches.jsonl").write_text(json.dumps(launch) + "\n")
    job = finished_jobs(sweep)[0]
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"paths.output_root={cwd}/o"]))
    paths = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]), results_dir=tmp_path / "r")
    md = paths[0].read_text()
    assert ("- command (recorded at launch): python -m laplace_lab.train -m x=1 paths.output_root=outputs "
            "'paths.data_dir=<outside the repository>/data'") in md
    assert "runs: 5 finished jobs in <outside the repository>/multirun" in md
    for path in paths:
        assert str(tmp_path) not in path.read_text() and "/somewhere" not in path.read_text()


def test_end_of_sweep_table_goes_into_the_sweep_folder_with_this_launch(sweep, tmp_path, repo):
    status_path = finished_jobs(sweep)[0] / "status.json"
    status_path.write_text(json.dumps({**json.loads(status_path.read_text()), "launch_id": "L0"}))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "runtime": {"choices": {"experiment": "toy"}}},
                            "aggregate": {"name": "toy", "metrics": ["test/map/acc"], "results_dir": "tables"}})
    callback = SweepSummary(fail_on_error=False, aggregator=SweepTable())
    callback.aggregate = validate_aggregate(OmegaConf.to_container(cfg.aggregate))
    callback.on_multirun_end(cfg)
    md = sweep / "tables" / "toy.md"
    assert json.loads((sweep / "summary.json").read_text())["results"][0] == str(md)
    text = md.read_text()
    assert "runs: 4 finished jobs" in text  # the L0 job belongs to another launch
    # abc1234 is not a commit of the repository: stated in the header, not refused, at the end of a sweep
    assert "provenance: NOT ONE CLEAN COMMIT" in text and "does not contain experiments/toy/preset.yaml" in text
    assert "No `experiments/*/reference*.yaml` names preset `toy`: no verdicts." in text


def test_many_launch_commands_are_summarised_and_each_jobs_is_in_the_jobs_csv(sweep, tmp_path):
    """Past HEADER_LIST_MAX commands the header names what they share and which keys vary."""
    jobs = finished_jobs(sweep)
    assert len(jobs) > provenance.HEADER_LIST_MAX
    with open(sweep / "launches.jsonl", "w") as f:
        for i, job in enumerate(jobs):
            f.write(json.dumps({"launch_id": f"L{i}", "command": f"python -m laplace_lab.train experiment=toy "
                                f"x={i} {'y=1 ' if i else ''}torch_num_threads=2"}) + "\n")
            status = json.loads((job / "status.json").read_text())
            (job / "status.json").write_text(json.dumps({**status, "launch_id": f"L{i}"}))
    with pytest.raises(tables.ProvenanceError, match=rf"launched by {len(jobs)} different commands \(1 job each\) "
                                                      r"that share \[experiment=toy\] and differ in x, y\."):
        tables.aggregate([sweep], "many", results_dir=tmp_path / "r")
    md, _, jobs_path = tables.aggregate([sweep], "many", results_dir=tmp_path / "r",
                                        admission=Admission(allow_mixed_launches=True))
    text = md.read_text()
    assert f"- commands (recorded at launch): {len(jobs)} different; each job's is in the `command` column" in text
    assert "- command (recorded at launch)" not in text
    commands = {sweep / Path(r["job"]).relative_to("multirun"): r["command"] for r in read_csv(jobs_path)}
    for i, job in enumerate(jobs):
        assert commands[job].startswith(f"python -m laplace_lab.train experiment=toy x={i} ")
    status = json.loads((jobs[0] / "status.json").read_text())  # a launch missing from launches.jsonl
    (jobs[0] / "status.json").write_text(json.dumps({**status, "launch_id": "gone"}))
    with pytest.raises(tables.ProvenanceError, match=rf"launched by {len(jobs) - 1} different commands \(1 job each\) "
                                                      r"that share \[experiment=toy y=1\] and differ in x; "
                                                      r"1 job recorded no launch\."):
        tables.aggregate([sweep], "many", results_dir=tmp_path / "r")


def test_many_sweep_folders_are_named_by_their_parent():
    folders = [f"outputs/x/multirun_seed={i}" for i in range(provenance.HEADER_LIST_MAX + 1)]
    assert tables._folders_text(folders) == (f"{len(folders)} sweep folders under outputs/x (each job's folder: "
                                             "the `job` column of the jobs CSV)")
    assert tables._folders_text(folders[:-1]) == ", ".join(folders[:-1])
    assert tables._folders_text([*folders, "elsewhere"]) == ", ".join([*folders, "elsewhere"])  # no common parent


def test_a_skipped_job_is_of_the_launch_that_skipped_it_with_the_command_that_ran_it(sweep, tmp_path):
    job = finished_jobs(sweep)[0]
    status = json.loads((job / "status.json").read_text())
    (job / "status.json").write_text(json.dumps({**status, "launch_id": "L0", "last_launch_id": "L1",
                                                 "last_action": "skipped"}))
    with open(sweep / "launches.jsonl", "a") as f:
        f.write(json.dumps({"launch_id": "L0", "command": "python -m laplace_lab.train -m x=0"}) + "\n")
    assert summarize(sweep, "L1")["skipped"] == [job.name] and summarize(sweep, "L0")["counts"]["skipped"] == 0
    md, *_ = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]), results_dir=tmp_path / "r",
                              admission=Admission(launch_id="L1", allow_mixed_launches=True))
    text = md.read_text()
    assert "runs: 5 finished jobs" in text and "[x=1] (4 jobs); [x=0] (1 job)" in text
    assert "- command (recorded at launch): python -m laplace_lab.train -m x=0" in text


# --- bad values and bad job folders (fail loudly) --------------------------------------------------------


def test_non_finite_values_are_left_out_counted_and_listed(sweep, tmp_path):
    nan_job = make_job(sweep, "mlp", "kron", 3, {"test/map/acc": float("nan"), "test/la/nll": 0.25})
    inf_job = make_job(sweep, "mlp", "kron", 4, {"test/map/acc": 0.9, "test/la/nll": float("inf")})
    md, csv_path, jobs_path = tables.aggregate([sweep], "toy",
                                               spec=TableSpec(metrics=["test/map/acc", "test/la/nll"]),
                                               results_dir=tmp_path / "r")
    row = next(r for r in read_csv(csv_path) if r["model"] == "mlp")
    acc = [m["test/map/acc"] for m in VALUES[("mlp", "kron")].values()] + [0.9]
    nll = [m["test/la/nll"] for m in VALUES[("mlp", "kron")].values()] + [0.25]
    assert row["n"] == "5" and row["test/map/acc n"] == "4" and row["test/map/acc nonfinite"] == "1"
    assert abs(float(row["test/map/acc mean"]) - statistics.fmean(acc)) < 1e-12
    assert abs(float(row["test/map/acc se"]) - statistics.stdev(acc) / 2) < 1e-12
    assert abs(float(row["test/la/nll mean"]) - statistics.fmean(nll)) < 1e-12 and row["test/la/nll n"] == "4"
    text = md.read_text()
    line = next(line for line in text.splitlines() if line.startswith("| mlp"))
    assert f"{statistics.fmean(acc):.4f} ± {statistics.stdev(acc) / 2:.4f} (n=4; 1 non-finite left out) |" in line
    assert f"- `multirun/{nan_job.name}`: test/map/acc = nan" in text
    assert f"- `multirun/{inf_job.name}`: test/la/nll = inf" in text
    assert "nan" in next(r for r in read_csv(jobs_path) if r["job"].endswith(nan_job.name))["test/map/acc"]


def test_corrupt_job_files_are_reported_not_dropped(sweep, tmp_path, caplog):
    jobs = finished_jobs(sweep)
    (jobs[0] / "metrics.json").write_text('{"test/map/acc": 0.9')  # truncated
    (jobs[1] / "status.json").write_text("")
    (jobs[2] / "metrics.json").unlink()
    md, csv_path, _ = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]),
                                       results_dir=tmp_path / "r")
    text = md.read_text()
    section = text.split("## Job folders left out (unreadable files)")[1]
    assert f"`multirun/{jobs[0].name}`: metrics.json is not valid JSON" in section
    assert f"`multirun/{jobs[1].name}`: status.json is not valid JSON" in section
    assert f"`multirun/{jobs[2].name}`: status.json says finished but metrics.json is missing" in section
    assert "runs: 2 finished jobs" in text
    assert sum(int(r["n"]) for r in read_csv(csv_path)) == 2
    assert str(jobs[0]) in caplog.text


def test_duplicate_jobs_are_refused(sweep, tmp_path):
    again = tmp_path / "again"  # the same job relaunched with another thread count and logger
    job = make_job(again, "lenet", "diag", 0, {"test/map/acc": 0.5})
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
        [*overrides, "torch_num_threads=4", "logger.wandb.enabled=false", "trainer.enable_progress_bar=false"]))
    with pytest.raises(tables.ProvenanceError, match=r"1 job\(s\) appear more than once .*"
                                                      r"\[multirun/curvature=diag,logger=csv,model=lenet,seed=0, "
                                                      r"again/curvature=diag"):
        tables.aggregate([sweep, again], "toy", results_dir=tmp_path / "r")
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, "seed=0.0", "prior=1"]))
    tables.aggregate([sweep, again], "toy", results_dir=tmp_path / "r")  # another prior: another job


def test_numbers_written_differently_are_one_group(tmp_path):
    sweep = tmp_path / "multirun"
    for seed, value in ((0, "1"), (1, "1.0")):
        job = make_job(sweep, "mlp", "kron", seed, {"test/map/acc": 0.5 + seed})
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"prior.prior_precision={value}",
                                                                      f"seed={seed}"]))
    _, csv_path, _ = tables.aggregate([sweep], "toy", results_dir=tmp_path / "r")
    (row,) = read_csv(csv_path)
    assert row["prior.prior_precision"] == "1" and row["n"] == "2"


def test_reference_section_from_the_preset_files(sweep, tmp_path, repo):
    sha = commit_files(repo, {"experiments/toy/preset.yaml": "a: 1\n"})
    for job in finished_jobs(sweep):
        set_git(job, sha)
    refs = {"preset": "toy", "references": [
        {"id": "acc", "kind": "value", "row": {"model": "mlp"}, "metric": "test/map/acc", "value": 0.93,
         "tolerance": 0.001, "source": "Paper, Table 1"},
        {"id": "mlp_better", "kind": "claim", "claim": "MLP beats LeNet", "op": ">", "source": "Paper, Sec. 2",
         "lhs": {"row": {"model": "mlp"}, "metric": "test/map/acc"},
         "rhs": {"row": {"model": "lenet"}, "metric": "test/map/acc"}}]}
    (repo / "experiments" / "paper").mkdir(parents=True)
    (repo / "experiments" / "paper" / "reference.yaml").write_text(yaml.safe_dump(refs))
    md, *_ = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["test/map/acc"]), preset="toy",
                              results_dir=tmp_path / "r")
    text = md.read_text()
    assert "From `experiments/paper/reference.yaml`" in text
    assert "| test/map/acc [model=mlp] (acc) | 0.93 ± 0.001 | 0.93 ± 0.01155 (n=3) | **reproduces** |" in text
    assert "| **reproduces** | Paper, Sec. 2 |" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"preset": "toy", "references": [{**refs["references"][0], "tolerance": "x"}]}))
    with pytest.raises(ValueError, match=r"bad.yaml: entry 'acc': field `tolerance`"):
        tables.aggregate([sweep], "toy", preset="toy", reference=bad, results_dir=tmp_path / "r2")
    with pytest.raises(ValueError, match=r"field `preset` names \['toy'\], but the table is for preset 'other'"):
        tables.aggregate([sweep], "toy", preset="other", reference=repo / "experiments/paper/reference.yaml")


def test_committed_reference_files_are_valid():
    from laplace_lab.config.presets import EXPERIMENTS_DIR
    from laplace_lab.reporting.reference import load_reference

    for path in sorted((provenance.REPO_ROOT / "experiments").glob("*/reference*.yaml")):
        loaded = load_reference(path)
        for preset in loaded["presets"]:
            assert (EXPERIMENTS_DIR / preset / "preset.yaml").is_file(), f"{path}: no such preset {preset}"


def test_cli_refuses_with_a_message_and_commits_results_only_when_asked(sweep, tmp_path, repo, preset_t, monkeypatch,
                                                                       capsys):
    set_git(finished_jobs(sweep)[0], "abc1234", dirty=True)
    with pytest.raises(SystemExit, match="error: --commit-results needs --preset"):
        tables.main([str(sweep), "--name", "t", "--commit-results", "--allow-mixed"])
    with pytest.raises(SystemExit, match="error: refusing to write table 't': 1 job.* ran from a dirty"):
        tables.main([str(sweep), "--preset", "t", "--commit-results"])
    assert not (repo / "results").exists()
    tables.main([str(sweep), "--preset", "t", "--commit-results", "--allow-mixed"])
    assert capsys.readouterr().out.split() == [str(repo / "results" / f"t{s}") for s in (".md", ".csv", ".jobs.csv")]
    # --preset alone: the preset's default sweep folder, tables written into it
    shutil.copytree(sweep, tmp_path / "outputs" / "redux_mnist" / "multirun")
    monkeypatch.chdir(tmp_path)
    tables.main(["--preset", "redux_mnist", "--metrics", "test/map/acc", "--allow-mixed"])
    assert (tmp_path / "outputs" / "redux_mnist" / "multirun" / "redux_mnist.jobs.csv").is_file()
    with pytest.raises(SystemExit, match="multirun folder outputs/sinusoid/multirun does not exist"):
        tables.main(["--preset", "sinusoid"])


def test_group_by_the_devices_a_job_recorded(sweep, tmp_path):
    """``devices.<field>`` groups by what status.json recorded: two fake GPUs, two rows."""
    for i, job in enumerate(finished_jobs(sweep)):
        status = json.loads((job / "status.json").read_text())
        status["devices"] = {"cuda_visible_devices": str(i % 2), "torch_device": "cuda:0", "accelerator": "cuda",
                             "device_ids": [0], "cuda_device_names": ["fake"]}
        (job / "status.json").write_text(json.dumps(status))
    tables.aggregate([sweep], "dev",
                     spec=TableSpec(metrics=["test/map/acc"], group_by=["devices.cuda_visible_devices"]),
                     results_dir=tmp_path / "res", admission=Admission(allow_mixed=True))
    rows = read_csv(tmp_path / "res" / "dev.csv")
    assert sorted(r["devices.cuda_visible_devices"] for r in rows) == ["0", "1"]
    assert sum(int(r["test/map/acc n"]) for r in rows) == len(finished_jobs(sweep))


def test_table_figures_draw_the_seed_mean_per_epoch_from_the_jobs_csv(sweep, tmp_path):
    """``augmentation_eta_rotation``: one figure from every seed's csv/metrics.csv (mean and range)."""
    from laplace_lab.reporting import figures as table_figures

    rot = {("mlp", "kron"): {0: [0.1, 0.3, 0.5], 1: [0.3, 0.5, 0.9], 2: [0.2, 0.4]}, ("lenet", "diag"): {0: [0.1, 0.1]}}
    for (model, curvature), seeds in rot.items():
        for seed, values in seeds.items():
            job = sweep / f"curvature={curvature},logger=csv,model={model},seed={seed}"
            (job / "csv").mkdir()
            rows = [{"epoch": e, "augmentation/rotation": v, "step": e} for e, v in enumerate(values)]
            rows.append({"epoch": "", "augmentation/rotation": 99.0, "step": 9})  # final metrics: no epoch
            with open(job / "csv" / "metrics.csv", "w", newline="") as f:
                w = csv.DictWriter(f, ["augmentation/rotation", "epoch", "step"])
                w.writeheader()
                w.writerows(rows)
    job0 = sweep / "curvature=kron,logger=csv,model=mlp,seed=0"
    assert table_figures.epoch_series(job0, "augmentation/rotation") == {1: 0.1, 2: 0.3, 3: 0.5}
    series = [table_figures.epoch_series(sweep / f"curvature=kron,logger=csv,model=mlp,seed={s}",
                                         "augmentation/rotation") for s in range(3)]
    epochs, mean, lo, hi = table_figures.seed_band(series)
    assert epochs == [1, 2, 3] and mean == pytest.approx([0.2, 0.4, 0.7]) and lo == [0.1, 0.3, 0.5] and hi == [0.3, 0.5, 0.9]
    md, *_ = tables.aggregate([sweep], "eta",
                              spec=TableSpec(metrics=["test/map/acc"],
                                             figures=["augmentation_eta_rotation", "augmentation_eta_translate_x"]),
                              results_dir=tmp_path / "r")
    png = tmp_path / "r" / "eta_figures" / "augmentation_eta_rotation.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000
    assert not (tmp_path / "r" / "eta_figures" / "augmentation_eta_translate_x.png").exists()  # no job logs it
    assert "![all groups: augmentation_eta_rotation](eta_figures/augmentation_eta_rotation.png)" in md.read_text()


def test_derived_mean_over_a_pattern_is_computed_per_job(tmp_path):
    sweep = tmp_path / "multirun"
    curves = {0: [0.1, 0.3, 0.8], 1: [0.2, 0.4, 0.6]}  # ECE at angles 0, 15, 30 per seed
    for seed, curve in curves.items():
        angles = {f"shift/rot_{a}/la/ece": v for a, v in zip((0, 15, 30), curve)}
        make_job(sweep, "mlp", "kron", seed, {**angles, "shift/rot_0/la/nll": 9.0, "test/la/ece": 0.05})
    name = "mean(shift/rot_*/la/ece)"
    _, csv_path, jobs = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=[name, "test/la/ece"]),
                                         results_dir=tmp_path / "r")
    per_seed = [statistics.fmean(c) for c in curves.values()]
    (row,) = read_csv(csv_path)
    assert abs(float(row[f"{name} mean"]) - statistics.fmean(per_seed)) < 1e-12  # nll at rot_0 not matched
    assert sorted(float(r[name]) for r in read_csv(jobs)) == pytest.approx(sorted(per_seed), abs=1e-15)


def test_derived_mean_refuses_unmatched_or_uneven_patterns(tmp_path):
    sweep = tmp_path / "multirun"
    make_job(sweep, "mlp", "kron", 0, {"shift/rot_0/la/ece": 0.1, "shift/rot_15/la/ece": 0.2})
    make_job(sweep, "mlp", "kron", 1, {"shift/rot_0/la/ece": 0.1})  # a shorter curve
    with pytest.raises(ValueError, match=r"averages different keys in different jobs"):
        tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["mean(shift/rot_*/la/ece)"]),
                         results_dir=tmp_path / "r")
    with pytest.raises(ValueError, match=r"matches no metric of any job"):
        tables.aggregate([sweep], "toy", spec=TableSpec(metrics=["mean(shift/rot_*/map/ece)"]),
                         results_dir=tmp_path / "r")


def test_derived_mean_is_non_finite_when_one_point_is(tmp_path):
    sweep = tmp_path / "multirun"
    make_job(sweep, "mlp", "kron", 0, {"shift/rot_0/la/ece": 0.1, "shift/rot_15/la/ece": float("nan")})
    make_job(sweep, "mlp", "kron", 1, {"shift/rot_0/la/ece": 0.3, "shift/rot_15/la/ece": 0.5})
    name = "mean(shift/rot_*/la/ece)"
    _, csv_path, _ = tables.aggregate([sweep], "toy", spec=TableSpec(metrics=[name]), results_dir=tmp_path / "r")
    (row,) = read_csv(csv_path)
    assert float(row[f"{name} mean"]) == pytest.approx(0.4) and row[f"{name} nonfinite"] == "1"
