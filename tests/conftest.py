"""Shared fixtures: Hydra composition and the real-data directory.

Real-data tests read ``LAPLACE_LAB_DATA_DIR``. When it is missing they are skipped on a
developer machine, but they FAIL under CI (``CI`` set), so CI cannot pass without the data.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import laplace_lab.config  # noqa: F401 (registers the schema nodes the option files start from)
from laplace_lab.config.store import register

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

# Runs log to an offline W&B run by default (logger.wandb.mode follows WANDB_MODE); the suite's runs
# do not: starting wandb costs seconds per run. Tests of the W&B output ask for it
# (logger.wandb.mode=offline, or WANDB_MODE=offline in a subprocess's environment).
WANDB_SUITE_MODE = "disabled"
os.environ["WANDB_MODE"] = WANDB_SUITE_MODE
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture
def data_dir() -> Path:
    """The directory with MNIST/, FashionMNIST/ and UCI/ (layout: README, "Pointing at a data directory")."""
    value = os.environ.get("LAPLACE_LAB_DATA_DIR")
    if value and Path(value, "MNIST").is_dir():
        return Path(value)
    message = f"real data not found: LAPLACE_LAB_DATA_DIR={value!r} has no MNIST/ folder"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must run the real-data tests)")
    pytest.skip(message)


def add_two_files(tmp_path: Path, monkeypatch, package, module: str, source: str, group: str, yaml: str) -> list[str]:
    """What a contributor adds, in temporary folders: ``<module>.py`` (``source``) on ``package``'s
    path and ``conf/<group>/<module>.yaml`` on Hydra's search path (its class's ``schema/<group>/<node>``
    registered, ``config.store``). Returns the overrides that
    compose with the yaml (``<group>=<module>``); the caller drops ``<package>.<module>`` from
    ``sys.modules`` after the test."""
    folder = tmp_path / "package"
    folder.mkdir()
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    conf = tmp_path / "conf" / group
    conf.mkdir(parents=True)
    (conf / f"{module}.yaml").write_text(textwrap.dedent(yaml))
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    importlib.invalidate_caches()
    register()  # the schema nodes of its class (a fresh process registers them when it imports laplace_lab.config)
    return [f"{group}={module}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]


def load_script(path: Path, name: str | None = None):
    """The Python file at ``path`` (a peer, benchmark or experiment script outside the package)
    imported as a module named ``name`` (default: the file's stem)."""
    spec = importlib.util.spec_from_file_location(name or Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jobs_csv(path: Path, table: str, rows: list[dict]) -> Path:
    """A ``<table>.jobs.csv`` as ``laplace_lab.reporting.tables`` writes it (``# table:`` line, then one
    row per job with the columns of ``rows[0]``) at ``path``; returns ``path``."""
    with path.open("w", newline="") as f:
        f.write(f"# table: {table}\n")
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def compose_config(overrides: list[str] | tuple[str, ...] = ()):
    """Compose ``conf/train.yaml`` with ``overrides`` (no Hydra run directory)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def run_config(overrides: list[str] | tuple[str, ...] = ()):
    """The typed, validated config (``config.load.load_run_config``) of ``compose_config(overrides)``."""
    from laplace_lab.config.load import load_run_config

    return load_run_config(compose_config(overrides))


@pytest.fixture
def compose_cfg():
    return compose_config


@pytest.fixture
def one_thread():
    """Small float64 problems: one torch thread (several threads on a shared CPU run ~10x
    slower from oversubscription); restored afterwards. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _suite_wandb_mode():
    """Every test starts with ``WANDB_MODE=disabled``: Lightning's ``WandbLogger(offline=True)`` sets it
    to ``dryrun`` for the rest of its process, which later runs' ``logger.wandb.mode`` would read."""
    os.environ["WANDB_MODE"] = WANDB_SUITE_MODE
    yield


@pytest.fixture(autouse=True)
def _no_inherited_wandb_service():
    """wandb puts its in-process service's socket in ``WANDB_SERVICE``; a run started in-process by one
    test would make every later subprocess (a multirun) connect to that socket after it is gone
    (``WandbServiceConnectionError``). Each test ends with the variable as it found it, and a service
    the test started is torn down with it (at interpreter exit it may already be gone: a later test's
    stop-every-child code can end it, and wandb's atexit teardown then prints "Connection lost")."""
    before = os.environ.get("WANDB_SERVICE")
    yield
    if before is None and os.environ.get("WANDB_SERVICE") and "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    if before is None:
        os.environ.pop("WANDB_SERVICE", None)
    else:
        os.environ["WANDB_SERVICE"] = before
