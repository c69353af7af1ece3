"""The Makefile's install step says what it is about to do before pip's quiet minutes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_install_announces_itself_before_the_quiet_pip(tmp_path):
    venv = tmp_path / "venv"  # not there: make plans the whole install (-n: nothing runs)
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "install", f"VENV={venv}"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    announce = next(i for i, line in enumerate(out) if "Installing PyTorch and about" in line)
    venv_step = next(i for i, line in enumerate(out) if "-m venv" in line)
    pip_steps = [i for i, line in enumerate(out) if "pip install --quiet" in line]
    assert announce < venv_step < pip_steps[0] and "a few minutes" in out[announce + 1]
    assert not venv.exists()
