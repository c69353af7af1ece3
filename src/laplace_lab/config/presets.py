"""A paper preset is one folder, ``experiments/<preset>/``, and this module is where that layout is
read: its Hydra config source and the file names every reader shares.

One folder holds:

- ``preset.yaml``: the Hydra config of ``experiment=<preset>`` (``# @package _global_``, the
  group overrides, the sweep and its ``aggregate`` table);
- ``reference.yaml`` (and any further ``reference*.yaml``): the numbers the table is judged by
  (``laplace_lab.reporting.reference``; found by the ``preset`` field they name);
- ``README.md``: what the preset reproduces, its status and deviations;
- ``smoke.yaml`` (optional): ``experiment=<preset>/smoke``, the preset cut to one seed and a few
  epochs, named ``<experiment_name>_smoke`` so that its folder and table say so; never a reproduction.

Hydra finds the folders through ``PresetConfigSource`` (scheme ``laplace-lab-presets://``), which
``conf/train.yaml`` puts on its search path (``hydra.searchpath``): it serves the config group
``experiment``, mapping ``experiment/<p>`` to ``<root>/<p>/preset.yaml`` and ``experiment/<p>/smoke``
to ``<root>/<p>/smoke.yaml``; nothing else of a folder is a config. A relative root is taken from
the repository root (``EXPERIMENTS_DIR`` is ``<repo>/experiments``, found as ``CONF_DIR`` is: the
package runs from its checkout, or an editable install of it). The source is registered with
Hydra when ``laplace_lab.config`` is imported, as the schema nodes are.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
SCHEME = "laplace-lab-presets"
GROUP = "experiment"            # the config group the folders serve: experiment=<preset>
PRESET_FILE = "preset.yaml"
SMOKE_FILE = "smoke.yaml"
SMOKE = "smoke"                 # experiment=<preset>/smoke; its experiment_name ends in _smoke
README_FILE = "README.md"
REFERENCE_GLOB = "reference*.yaml"


def preset_names(root: str | Path = EXPERIMENTS_DIR) -> list[str]:
    """The presets under ``root``: the folders that hold a ``preset.yaml``, sorted."""
    root = Path(root)
    return sorted(p.parent.name for p in root.glob(f"*/{PRESET_FILE}")) if root.is_dir() else []


def preset_path(preset: str, root: str | Path = EXPERIMENTS_DIR) -> Path:
    """``<root>/<preset>/preset.yaml``; a ValueError listing the presets when there is none."""
    path = Path(root) / preset / PRESET_FILE
    if "/" in preset or not path.is_file():
        raise ValueError(f"preset {preset!r} does not exist (no {Path(root).name}/{preset}/{PRESET_FILE}); "
                         f"allowed: {preset_names(root)}")
    return path


def smoke_path(preset: str, root: str | Path = EXPERIMENTS_DIR) -> Path | None:
    """``<root>/<preset>/smoke.yaml`` when the preset has a smoke variant, else None."""
    path = Path(root) / preset / SMOKE_FILE
    return path if path.is_file() else None


def is_smoke_choice(choice: str | None) -> bool:
    """Whether an ``experiment`` choice (``hydra.runtime.choices.experiment``) is a smoke variant."""
    return bool(choice) and str(choice).endswith(f"/{SMOKE}")


class PresetConfigSource(ConfigSource):
    """Hydra's view of the preset folders: the group ``experiment`` (see the module docstring)."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        root = Path(self.path)
        self.root = root if root.is_absolute() else REPO_ROOT / root

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _file(self, config_path: str) -> Path | None:
        """The file behind ``experiment/<p>`` or ``experiment/<p>/smoke`` (extension optional)."""
        name = config_path[:-len(".yaml")] if config_path.endswith(".yaml") else config_path
        parts = name.strip("/").split("/")
        if len(parts) == 2 and parts[0] == GROUP:
            return self.root / parts[1] / PRESET_FILE
        if len(parts) == 3 and parts[0] == GROUP and parts[2] == SMOKE:
            return self.root / parts[1] / SMOKE_FILE
        return None

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._file(config_path)
        if path is None or not path.is_file():
            raise ConfigLoadError(f"Config not found : {config_path} (under {self.root})")
        text = path.read_text(encoding="utf-8")
        return ConfigResult(config=OmegaConf.create(text) if text.strip() else OmegaConf.create(),
                            path=f"{SCHEME}://{self.root}", provider=self.provider,
                            header=ConfigSource._get_header_dict(text[:512]))

    def available(self) -> bool:
        return self.root.is_dir()

    def is_group(self, config_path: str) -> bool:
        parts = [p for p in config_path.strip("/").split("/") if p]
        if not parts:
            return self.available()
        if parts[0] != GROUP:
            return False
        return len(parts) == 1 or (len(parts) == 2 and (self.root / parts[1] / SMOKE_FILE).is_file())

    def is_config(self, config_path: str) -> bool:
        path = self._file(config_path)
        return path is not None and path.is_file()

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        parts = [p for p in config_path.strip("/").split("/") if p]
        groups: list[str] = []
        configs: list[str] = []
        if not parts:
            groups = [GROUP] if self.available() else []
        elif parts == [GROUP]:
            configs = preset_names(self.root)
            groups = [p for p in configs if (self.root / p / SMOKE_FILE).is_file()]
        elif len(parts) == 2 and parts[0] == GROUP and (self.root / parts[1] / SMOKE_FILE).is_file():
            configs = [SMOKE]
        out = (groups if results_filter in (None, ObjectType.GROUP) else []) + \
              (configs if results_filter in (None, ObjectType.CONFIG) else [])
        return sorted(set(out))


def register() -> None:
    """Make ``laplace-lab-presets://`` known to Hydra (idempotent)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PresetConfigSource)

