"""Nothing runs that was not asked for: files and configs from outside the process are data.

Every ``_target_`` is checked against one allowlist (``config.targets``), from the command line, a
preset, a restored ``config_resolved.yaml`` and ``hydra.callbacks``; checkpoints are read with
``weights_only=True``; ``records restore`` copies only record files (no links, nothing oversized,
nothing outside the output root) and ``records save`` names no machine path or host. A pickle
payload here creates a marker file when unpickled: the marker must never appear."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from laplace_lab.config import targets as safe_targets
from laplace_lab.sweeps import progress, records
from laplace_lab.train import run
from laplace_lab.training import job_laplace
from tests.conftest import compose_config

from .helpers import ENV

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling it creates ``marker`` (``open(marker, "w")``)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def evil(tmp_path) -> tuple[Path, Path]:
    """(a torch file whose unpickling runs code, the marker that code creates)."""
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pkl"
    torch.save({"epoch": Payload(marker), "state_dict": {}}, path)
    return path, marker


def test_loader_targets_are_refused_from_the_command_line(evil, tmp_path):
    path, marker = evil
    for target in ("torch.load", "torch.hub.load", "laplace_lab.sweeps.records.restore", "torch.serialization.load"):
        cfg = compose_config(["data=sinusoid", f"data._target_={target}", f"+data.f={path}", "+data.weights_only=false",
                              "logger=csv"])
        with pytest.raises(ValueError, match=rf"data._target_='{target}' is not allowed; allowed: \[.*'laplace_lab.data.SinusoidDataModule'"):
            run(cfg, tmp_path / "run")
    assert not marker.exists()


def test_the_allowlist_names_no_prefix_and_covers_every_target_in_conf():
    assert all(not t.endswith(".") for t in safe_targets.allowed_targets())
    in_conf = {line.split("_target_:")[1].strip() for p in [*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "experiments").glob("*/preset.yaml"),
                                                              *(ROOT / "experiments").glob("*/smoke.yaml")]
               for line in p.read_text().splitlines() if "_target_:" in line}
    assert in_conf and in_conf <= safe_targets.allowed_targets(), in_conf - safe_targets.allowed_targets()
    with pytest.raises(ValueError, match="hydra.callbacks.x._target_='shutil.copyfile' is not allowed"):
        safe_targets.check_hydra_node({"hydra": {"callbacks": {"x": {"_target_": "shutil.copyfile"}}}})


def test_a_preset_and_a_hydra_callback_cannot_run_code(evil, tmp_path):
    """Through the real entry point: a preset naming torch.load, and a hydra.callbacks entry naming
    shutil.copyfile (which Hydra instantiates before any job) are refused, exit status 1."""
    path, marker = evil
    presets = tmp_path / "conf" / "experiment"
    presets.mkdir(parents=True)
    (presets / "evil.yaml").write_text(f"# @package _global_\ndata:\n  _target_: torch.load\n  f: {path}\n"
                                       "  weights_only: false\n")
    env = {**os.environ, **ENV}
    env.pop("HYDRA_FULL_ERROR")
    base = [sys.executable, "-m", "laplace_lab.train", f"hydra.run.dir={tmp_path / 'run'}", "logger=csv"]
    proc = subprocess.run([*base, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=evil"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "data._target_='torch.load' is not allowed" in proc.stderr, proc.stderr[-2000:]
    copy = tmp_path / "copied"
    proc = subprocess.run([*base, "+hydra.callbacks.x._target_=shutil.copyfile", f"+hydra.callbacks.x.src={path}",
                           f"+hydra.callbacks.x.dst={copy}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "hydra.callbacks.x._target_='shutil.copyfile' is not allowed" in proc.stderr
    assert "Traceback" not in proc.stderr  # the message alone
    assert not copy.exists() and not marker.exists()


def test_progress_reads_checkpoints_without_unpickling(evil, tmp_path, capsys):
    path, marker = evil
    job = tmp_path / "multirun" / "seed=0"
    (job / "checkpoints").mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"state": "running", "pid": 2**22 + 7, "host": socket.gethostname()}))
    (job / "checkpoints" / "last.ckpt").write_bytes(path.read_bytes())
    assert progress.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "cut off   multirun/seed=0"  # no epoch: the file is refused
    assert not marker.exists()


def test_job_laplace_checks_the_restored_config_and_the_checkpoint(evil, tmp_path):
    path, marker = evil
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "config_resolved.yaml").write_text(yaml.safe_dump({"data": {"_target_": "torch.load", "f": str(path),
                                                                        "weights_only": False}}))
    with pytest.raises(ValueError, match=r"data._target_='torch.load' in .*config_resolved.yaml is not allowed"):
        job_laplace.load_job(job)
    from omegaconf import OmegaConf

    from laplace_lab.config.load import load_run_config

    with pytest.raises(ValueError, match=r"data._target_='torch.load' is not allowed"):  # any rebuild of a job
        load_run_config(OmegaConf.load(job / "config_resolved.yaml"))  # (training.build takes what this returns)
    (job / "checkpoints" / "last.ckpt").write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match=r"last.ckpt cannot be read as a checkpoint .* weights_only=True"):
        job_laplace.best_state(job)
    assert not marker.exists()


def _records(tmp_path: Path) -> Path:
    """A records folder with one job: its status and metrics."""
    job = tmp_path / "records" / "exp" / "multirun" / "seed=0"
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"state": "finished"}))
    (job / "metrics.json").write_text(json.dumps({"test/map/acc": 0.9}))
    return job


def test_restore_copies_only_record_files(evil, tmp_path):
    path, marker = evil
    job = _records(tmp_path)
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "last.ckpt").write_bytes(path.read_bytes())
    (job / "checkpoints" / "meta.json").write_text("{}")  # a record suffix, but in a folder save skips
    (job / "train.log").write_text("log")
    out = tmp_path / "out"
    assert records.restore(tmp_path / "records", out) == (2, 0)
    restored = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert restored == ["exp/multirun/seed=0/metrics.json", "exp/multirun/seed=0/status.json"]
    assert progress.main([str(out)]) == 0 and not marker.exists()


@pytest.mark.parametrize("case", ["file_link", "folder_link", "sparse", "dest_link"])
def test_restore_refuses_links_big_files_and_destinations_outside(tmp_path, case):
    job = _records(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "x"}')
    out = tmp_path / "out"
    if case == "file_link":
        (job / "config.json").symlink_to(secret)
        pattern = r"config.json: a symbolic link"
    elif case == "folder_link":
        (job / "csv").symlink_to(tmp_path, target_is_directory=True)
        pattern = r"seed=0/csv: a symbolic link"
    elif case == "sparse":
        with open(job / "metrics.csv", "wb") as f:  # 16 kB on disk at most, 501 MB by its size
            f.truncate(501 * 2**20)
        pattern = r"metrics.csv: 525336576 bytes, over the 16777216 bytes"
    else:  # the output root already has a link where a record goes
        (out / "exp" / "multirun").mkdir(parents=True)
        (out / "exp" / "multirun" / "seed=0").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        (tmp_path / "elsewhere").mkdir()
        pattern = r"lies outside"
    with pytest.raises(ValueError, match=pattern):
        records.restore(tmp_path / "records", out)
    copied = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert copied == [] and not (tmp_path / "elsewhere" / "status.json").exists()


def test_save_names_no_machine_path_and_no_host(tmp_path):
    sweep = tmp_path / "out" / "exp" / "multirun"
    job = sweep / "seed=0"
    (job / ".hydra").mkdir(parents=True)
    repo, cache, ckpt = str(tmp_path / "checkout"), "/scratch/user42/map_cache", "/scratch/user42/ckpt/seed=0"
    hydra = {"hydra": {"runtime": {"cwd": repo, "config_sources": [{"provider": "main", "path": f"{repo}/conf"}]},
                       "sweep": {"dir": str(sweep)}}}
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    config = {"paths": {"output_root": str(tmp_path / "out"), "data_dir": "/data/shared"},
              "map_cache": {"dir": cache}, "checkpoint": {"dirpath": ckpt, "resume_from": "/scratch/old/last.ckpt"}}
    (job / "config_resolved.yaml").write_text(yaml.safe_dump(config))
    (job / "metrics.json").write_text("{}")
    host = socket.gethostname()
    (job / "status.json").write_text(json.dumps({"state": "finished", "host": "gpu-node-17", "pid": 1}, indent=2))
    (sweep / "launches.jsonl").write_text(json.dumps({"launch_id": "a", "host": host, "cwd": repo}) + "\n")
    (job / "linked.json").symlink_to(tmp_path / "secret.json")
    (tmp_path / "secret.json").write_text('{"token": "x"}')
    records.save(tmp_path / "out", tmp_path / "rec")
    saved = {p.name: p.read_text() for p in (tmp_path / "rec").rglob("*") if p.is_file()}
    assert "linked.json" not in saved  # a link is not followed into the records
    for name, text in saved.items():
        assert not records.absolute_paths(text), (name, text)
        assert "gpu-node-17" not in text and f'"{host}"' not in text, (name, text)
    assert "<map_cache_dir>" in saved["config_resolved.yaml"] and "<checkpoint_dir>" in saved["config_resolved.yaml"]
    assert json.loads(saved["status.json"])["host"] == "<host>"
    # a path that no token covers stops save, naming the file
    (job / "eval_report.json").write_text(json.dumps({"note": "written to /somewhere/else/x.png"}))
    with pytest.raises(ValueError, match=r"eval_report.json: machine path\(s\) \['/somewhere/else/x.png'\]"):
        records.save(tmp_path / "out", tmp_path / "rec2")
