"""Run ``python -m laplace_lab.train -m ...`` in a subprocess and read what it leaves behind."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from laplace_lab.sweeps.run_only import sweep_dirname, sweeper_choice

# Tiny jobs: one batch of train/val on generated 2-D data, no evaluation, CSV only.
TINY = ["data=toy2d", "trainer=debug", "logger=csv", "evaluation=none"]


def require_plugin(module: str) -> None:
    """Skip when a Hydra plugin is not installed; fail under CI (``make test`` installs them)."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[launchers,sweepers]')"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the sweep tests")
        pytest.skip(message)


ENV = {"WANDB_MODE": "disabled", "WANDB_SILENT": "true", "RAY_USAGE_STATS_ENABLED": "0", "HYDRA_FULL_ERROR": "1"}


def multirun_command(tmp_path: Path, *overrides: str, script: str | None = None) -> tuple[list[str], Path]:
    """The command of a multirun with outputs under ``tmp_path/out`` (``script``: a Hydra app file
    instead of ``laplace_lab.train``) and the sweep folder it will use."""
    args = ["-m", f"paths.output_root={tmp_path / 'out'}", *overrides]
    cmd = [sys.executable, script, *args] if script else [sys.executable, "-m", "laplace_lab.train", *args]
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("experiment_name=")), "default")
    hydra = [o for o in overrides if o.startswith("hydra")]
    return cmd, tmp_path / "out" / name / sweep_dirname([o for o in overrides if o not in hydra], sweeper_choice(hydra))


def multirun(tmp_path: Path, *overrides: str, timeout: float = 240,
             script: str | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Launch a multirun with outputs under ``tmp_path/out``; returns the process and the sweep dir."""
    cmd, sweep = multirun_command(tmp_path, *overrides, script=script)
    proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True,
                          timeout=timeout)
    return proc, sweep


def summary(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "summary.json").read_text())


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline ``run-*.wandb`` file (wandb's LevelDB-style log)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", "not a wandb datastore file"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records
