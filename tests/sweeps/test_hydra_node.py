"""One trust boundary for everything Hydra instantiates (``config.targets``): the ``hydra`` node is
checked as Hydra composes it, before its interpolations are resolved and before any callback,
logging config, launcher or sweeper is built; the job config's targets are checked per slot.

A refused case must leave no side effect: each names ``shutil.copyfile`` (or a ``FileHandler``)
on a file of ``tmp_path``, and the copy must not appear (the victim must keep its content)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import laplace_lab.train  # noqa: F401  (installs the guard, as the entry point does)
from laplace_lab.config import CONF_DIR
from laplace_lab.config import targets as safe_targets
from tests.conftest import run_config

from .helpers import ENV

COPY = "{_target_: shutil.copyfile, src: %s, dst: %s}"


def _compose(overrides: list[str], searchpath: Path | None = None):
    extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[*extra, *overrides], return_hydra_config=True)


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    """(a source file, the path a copy of it would take)."""
    src = tmp_path / "secret"
    src.write_text("secret")
    return src, tmp_path / "copied"


def _preset(tmp_path: Path, body: str) -> Path:
    presets = tmp_path / "conf" / "experiment"
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "evil.yaml").write_text("# @package _global_\n" + body)
    return tmp_path / "conf"


COMMAND_LINE = {
    "oc.create callback": (lambda s, d: [f"+hydra.callbacks.x='${{oc.create:\"{COPY % (s, d)}\"}}'"],
                           r"hydra.callbacks.x=.* the resolver 'oc.create' is refused inside hydra"),
    "oc.decode callback": (lambda s, d: [f"+hydra.callbacks.x='${{oc.decode:\"{COPY % (s, d)}\"}}'"],
                           r"the resolver 'oc.decode' is refused inside hydra"),
    "a root node as callback": (lambda s, d: [f"+evil={COPY % (s, d)}".replace(" ", ""), "+hydra.callbacks.x=${evil}"],
                                r"hydra.callbacks.x='\$\{evil\}' is not allowed: an interpolation inside hydra may "
                                r"not insert a node \(evil is a mapping\)"),
    "a chain of references": (lambda s, d: [f"+evil={COPY % (s, d)}".replace(" ", ""), "+link=${evil}",
                                            "+hydra.callbacks.x=${link}"], r"evil is a mapping"),
    "a target by interpolation": (lambda s, d: ["+name=shutil.copyfile", "+hydra.callbacks.x._target_=${name}",
                                                f"+hydra.callbacks.x.src={s}", f"+hydra.callbacks.x.dst={d}"],
                                  r"hydra.callbacks.x._target_='\$\{name\}' is not allowed: .* takes a literal name"),
    "a file handler on any file": (lambda s, d: ["+hydra.job_logging.handlers.x.class=logging.FileHandler",
                                                 f"+hydra.job_logging.handlers.x.filename={s}",
                                                 "+hydra.job_logging.handlers.x.mode=w"],
                                   r"hydra.job_logging.handlers.x.filename=.* a log file is a plain name in the job's"),
    "a handler class": (lambda s, d: ["+hydra.hydra_logging.handlers.x.class=shutil.copyfile"],
                        r"hydra.hydra_logging.handlers.x.class='shutil.copyfile' is not allowed; allowed: "
                        r"\['logging.FileHandler', 'logging.StreamHandler'\]"),
    "an ext:// level": (lambda s, d: ["hydra.job_logging.root.level=ext://antigravity"],
                        r"hydra.job_logging.root.level='ext://antigravity' is not allowed"),
    "an allowed target in the wrong slot": (lambda s, d: ["+hydra.callbacks.x._target_=laplace_lab.models.MLP"],
                                            r"hydra.callbacks.x._target_='laplace_lab.models.MLP' is not allowed; "
                                            r"allowed: \['laplace_lab.sweeps.callback.SweepSummary', "
                                            r"'laplace_lab.sweeps.sweep_eta.SweepETA'\] \(hydra.callbacks.\*._target_ "
                                            "takes one of these"),
    "a target outside any slot": (lambda s, d: [f"+hydra.callbacks.sweep_eta.x={COPY % (s, d)}".replace(" ", "")],
                                  r"hydra.callbacks.sweep_eta.x._target_='shutil.copyfile' is not allowed: "
                                  r"hydra.callbacks.sweep_eta.x is not a slot that takes a class"),
    "a preloaded library": (lambda s, d: [f"+hydra.job.env_set.LD_PRELOAD={s}"],
                            r"hydra.job.env_set.LD_PRELOAD is not allowed: it changes what code a job loads"),
    "a python path": (lambda s, d: [f"+hydra.job.env_set.PYTHONPATH={s}"], r"env_set.PYTHONPATH is not allowed"),
}
PRESETS = {
    "oc.create callback": ("hydra:\n  callbacks:\n    x: \"${oc.create:'" + COPY + "'}\"\n",
                           r"the resolver 'oc.create' is refused inside hydra"),
    "formatter factory": ("hydra:\n  job_logging:\n    formatters:\n      f:\n        '()': shutil.copyfile\n"
                          "        src: %s\n        dst: %s\n",
                          r"hydra.job_logging.formatters.f.\(\) is not allowed; allowed keys: \['datefmt', 'format'"),
    "formatter class": ("hydra:\n  hydra_logging:\n    formatters:\n      f:\n        class: shutil.copyfile\n"
                        "        format: '%s %s'\n", r"hydra.hydra_logging.formatters.f.class is not allowed"),
}


@pytest.mark.parametrize("case", sorted(COMMAND_LINE))
def test_the_hydra_node_is_checked_as_composed(case, files):
    src, dst = files
    overrides, message = COMMAND_LINE[case]
    with pytest.raises(safe_targets.HydraNodeError, match=message):
        _compose(overrides(src, dst))
    assert not dst.exists() and src.read_text() == "secret"


@pytest.mark.parametrize("case", sorted(PRESETS))
def test_a_preset_hydra_node_is_checked(case, files, tmp_path):
    src, dst = files
    body, message = PRESETS[case]
    with pytest.raises(safe_targets.HydraNodeError, match=message):
        _compose(["experiment=evil"], _preset(tmp_path, body % (src, dst)))
    assert not dst.exists()


SLURM = "hydra/launcher=submitit_slurm"
OPTUNA = "hydra/sweeper=map_optuna"
LAUNCH_OPTIONS = {  # shell lines a SLURM batch script runs, files or servers an Optuna study uses
    "a shell command": (lambda s, d: [SLURM, f"hydra.launcher.setup=['cp {s} {d}']"],
                        r"hydra.launcher.setup\[0\]='cp .*' is not allowed; allowed: null or a list of lines of "
                        r"the forms \['module load\|unload\|swap <name>...', 'module purge', 'conda activate <name>'"),
    "a chained command": (lambda s, d: [SLURM, f"hydra.launcher.setup=['module load cuda; cp {s} {d}']"],
                          r"hydra.launcher.setup\[0\]='module load cuda; cp .*' is not allowed"),
    "a command substitution": (lambda s, d: [SLURM, f"hydra.launcher.setup=['export X=`cp {s} {d}`']"],
                               r"hydra.launcher.setup\[0\]='export X=`cp .*`' is not allowed"),
    "a code-loading variable": (lambda s, d: [SLURM, f"hydra.launcher.setup=['export LD_PRELOAD={s}']"],
                                r"LD_PRELOAD changes what code a job loads or runs"),
    "a sourced file": (lambda s, d: [SLURM, f"hydra.launcher.setup=['source {s}']"], r"setup\[0\]='source .*secret'"),
    "an interpolated line": (lambda s, d: [SLURM, "hydra.launcher.setup=['${oc.env:EVIL_LINE}']"],
                             r"hydra.launcher.setup\[0\]='\$\{oc.env:EVIL_LINE\}' is not allowed"),
    "a study file elsewhere": (lambda s, d: [OPTUNA, f"hydra.sweeper.storage='sqlite:///{d}'"],
                               r"hydra.sweeper.storage='sqlite:///.*copied' is not allowed; allowed: null .* or a "
                               r"sqlite file in the sweep's own folder, 'sqlite:///\$\{hydra.sweep.dir\}/<name>.db'"),
    "a study file above the folder": (lambda s, d: [OPTUNA, "hydra.sweeper.storage='sqlite:///${hydra.sweep.dir}/../x.db'"],
                                      r"hydra.sweeper.storage=.*/../x.db' is not allowed"),
    "a database server": (lambda s, d: [OPTUNA, "hydra.sweeper.storage='postgresql://lab@db.example/optuna'"],
                          r"hydra.sweeper.storage='postgresql://lab@db.example/optuna' is not allowed"),
}


@pytest.mark.parametrize("case", sorted(LAUNCH_OPTIONS))
def test_launch_shell_lines_and_study_storage_are_checked(case, files, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    monkeypatch.setenv("EVIL_LINE", "cp a b")
    src, dst = files
    overrides, message = LAUNCH_OPTIONS[case]
    with pytest.raises(safe_targets.HydraNodeError, match=message):
        _compose(overrides(src, dst))
    assert not dst.exists()


def test_a_preset_cannot_set_shell_lines_either(files, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    src, dst = files
    body = f"defaults:\n  - override /hydra/launcher: submitit_slurm\nhydra:\n  launcher:\n    setup: ['cp {src} {dst}']\n"
    with pytest.raises(safe_targets.HydraNodeError, match=r"hydra.launcher.setup\[0\]='cp .*' is not allowed"):
        _compose(["experiment=evil"], _preset(tmp_path, body))


def test_the_documented_shell_lines_and_study_file_pass():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    lines = ["module purge", "module load cuda/12.1 gcc", "conda activate lab", "source .venv/bin/activate",
             "export LAPLACE_LAB_DATA_DIR=/shared/data", "export OMP_NUM_THREADS=8"]
    cfg = _compose([SLURM, OPTUNA, f"hydra.launcher.setup=[{','.join(repr(line) for line in lines)}]",
                    "hydra.sweeper.storage='sqlite:///${hydra.sweep.dir}/optuna.db'"])
    assert list(cfg.hydra.launcher.setup) == lines
    assert cfg.hydra.sweeper.storage == f"sqlite:///{cfg.hydra.sweep.dir}/optuna.db"


@pytest.mark.parametrize("overrides", [[], ["hydra/launcher=submitit_local"], ["hydra/launcher=submitit_slurm"],
                                       ["hydra/launcher=ray"], ["hydra/sweeper=map_optuna"],
                                       ["hydra/sweeper=map_grid"], ["hydra.job_logging.root.level=DEBUG"]])
def test_the_project_hydra_configs_pass(overrides):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    _compose(overrides)


@pytest.mark.parametrize("override, message", [
    ("callbacks.online_marglik._target_=laplace_lab.sweeps.callback.SweepSummary",
     r"callbacks.online_marglik._target_='laplace_lab.sweeps.callback.SweepSummary' is not allowed; allowed: "
     r"\['laplace_lab.training.callbacks.checkpoints', .*\] \(callbacks.\*._target_ takes one of these"),
    ("module._target_=laplace_lab.models.MLP",
     r"module._target_='laplace_lab.models.MLP' is not allowed; allowed: \['laplace_lab.training.module.MAPCore'\]"),
    ("optimizer._target_=laplace_lab.models.MLP", r"allowed: \['torch.optim.Adam', 'torch.optim.AdamW'"),
    ("+evil._target_=torch.optim.Adam", r"evil._target_='torch.optim.Adam' is not allowed: evil is not a slot"),
])
def test_a_job_target_is_checked_in_its_slot(override, message):
    with pytest.raises(ValueError, match=message):
        run_config(["data=sinusoid", override])


def test_a_job_config_is_checked_after_interpolation():
    with pytest.raises(ValueError, match=r"callbacks.x._target_='shutil.copyfile' is not allowed"):
        run_config(["data=sinusoid", "+callbacks.x='${oc.create:\"{_target_: shutil.copyfile}\"}'"])


def _entry_point(tmp_path: Path, *overrides: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    env.pop("HYDRA_FULL_ERROR")
    cmd = [sys.executable, "-m", "laplace_lab.train", *flags, f"hydra.run.dir={tmp_path / 'run'}",
           f"paths.output_root={tmp_path / 'out'}", "logger=csv", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_entry_point_refuses_before_any_callback_runs(files, tmp_path):
    """``-m`` too: Hydra builds its callbacks before the sweeper and the first job."""
    src, dst = files
    proc = _entry_point(tmp_path, *COMMAND_LINE["oc.create callback"][0](src, dst), flags=("-m",))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the resolver 'oc.create' is refused inside hydra" in proc.stderr and "Traceback" not in proc.stderr
    assert not dst.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a root node as callback", "a file handler on any file"])
def test_the_entry_point_refuses_more(case, files, tmp_path):
    src, dst = files
    proc = _entry_point(tmp_path, *COMMAND_LINE[case][0](src, dst))
    assert proc.returncode == 1 and "is not allowed" in proc.stderr, proc.stderr[-2000:]
    assert not dst.exists() and src.read_text() == "secret"


@pytest.mark.slow
def test_the_entry_point_refuses_a_preset_formatter(files, tmp_path):
    src, dst = files
    conf = _preset(tmp_path, PRESETS["formatter factory"][0] % (src, dst))
    proc = _entry_point(tmp_path, f"hydra.searchpath=[file://{conf}]", "experiment=evil")
    assert proc.returncode == 1 and "formatters.f.() is not allowed" in proc.stderr, proc.stderr[-2000:]
    assert not dst.exists()
