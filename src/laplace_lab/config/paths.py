"""The options of a job config that become part of a path (``io.names``), checked on the resolved
config: ``experiment_name`` is a plain name (a folder under ``paths.output_root`` and the wandb
group), ``paths.output_root``, ``map_cache.dir`` and a set ``checkpoint.dirpath`` are folders, not
empty and not the filesystem root. ``check_paths(data)`` raises ``ValueError`` naming the option.

``check_composed(config)`` is the same check on a composed ``DictConfig`` (with its ``hydra`` node:
``hydra.run.dir`` and ``hydra.sweep.dir`` too), called where Hydra composes it (``config.targets``),
so the run folder is never made from a bad value; a value that cannot be resolved there yet is left
to ``check_paths``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laplace_lab.io.names import check_name, check_root

NAMES = ("experiment_name",)
ROOTS = ("paths.output_root", "map_cache.dir", "checkpoint.dirpath")  # checkpoint.dirpath: null is its default
HYDRA_ROOTS = ("hydra.run.dir", "hydra.sweep.dir")
_ABSENT = object()


def _select(data: Mapping, key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _check(key: str, value: Any) -> None:
    if value is _ABSENT or (value is None and key == "checkpoint.dirpath"):
        return
    (check_name if key in NAMES else check_root)(value, key)


def check_paths(data: Mapping) -> None:
    """The path options of a resolved job config (a plain mapping)."""
    for key in (*NAMES, *ROOTS):
        _check(key, _select(data, key))


def check_composed(config: Any) -> None:
    """The path options of a composed config, each resolved on its own (unresolvable: skipped)."""
    from omegaconf import OmegaConf

    for key in (*NAMES, *ROOTS, *HYDRA_ROOTS):
        try:
            value = OmegaConf.select(config, key, default=_ABSENT)
        except Exception:  # noqa: BLE001 (e.g. ${hydra:...} before Hydra sets its config: checked per job)
            continue
        _check(key, value)
