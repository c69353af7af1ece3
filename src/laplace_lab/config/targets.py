"""The one allowlist of what a config may instantiate (``_target_``), and its checks.

A config is code: Hydra imports a ``_target_`` and calls it. Configs reach this package from the
command line, from presets, from a restored job's ``config_resolved.yaml`` and from ``hydra.callbacks``,
so every ``_target_`` of each of them must be one of ``ALLOWED_TARGETS``: the project's own classes
named in ``conf/`` and a few named library classes (optimisers, schedulers, Hydra's launchers and
sweepers, Optuna's samplers). No module prefix is allowed: ``torch.`` would admit ``torch.load``
(which unpickles a file), ``laplace_lab.`` would admit functions that copy or write files.

- ``check_targets(data, where)``: ``ValueError`` naming the first ``_target_`` outside the list.
- ``check_hydra_node(config)``: the same for the ``hydra`` node (callbacks, launcher, sweeper and
  its sampler); Optuna's ``custom_search_space`` (a callable named by text) must be null.
- ``guard_hydra_callbacks()``: runs ``check_hydra_node`` before Hydra instantiates the callbacks of a
  run or multirun (``hydra._internal.callbacks.Callbacks``, Hydra 1.3), i.e. before anything of the
  config is called; ``laplace_lab.train`` installs it at import.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from hydra.errors import CompactHydraException

PROJECT_TARGETS = frozenset({
    "laplace_lab.data.Toy2DDataModule",
    "laplace_lab.data.SinusoidDataModule",
    "laplace_lab.data.UCIDataModule",
    "laplace_lab.data.VisionDataModule",
    "laplace_lab.models.MLP",
    "laplace_lab.models.LeNet",
    "laplace_lab.models.ResNet18",
    "laplace_lab.models.WideResNet",
    "laplace_lab.training.schedules.StepwiseCosine",
    "laplace_lab.training.module.MAPCore",
    "laplace_lab.training.callbacks.online_marglik",
    "laplace_lab.training.callbacks.augmentation_marglik",
    "laplace_lab.training.callbacks.checkpoints",
    "laplace_lab.training.callbacks.epoch_eta",
    "laplace_lab.sweeps.callback.SweepSummary",
    "laplace_lab.reporting.sweep_table.SweepTable",
    "laplace_lab.sweeps.sweep_eta.SweepETA",
})
LIBRARY_TARGETS = frozenset({
    "torch.optim.Adam", "torch.optim.AdamW", "torch.optim.SGD", "torch.optim.RMSprop",
    "torch.optim.lr_scheduler.CosineAnnealingLR", "torch.optim.lr_scheduler.StepLR",
    "torch.optim.lr_scheduler.MultiStepLR", "torch.optim.lr_scheduler.ExponentialLR",
})
HYDRA_TARGETS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "optuna.samplers.TPESampler", "optuna.samplers.RandomSampler", "optuna.samplers.CmaEsSampler",
    "optuna.samplers.GridSampler", "optuna.samplers.NSGAIISampler", "optuna.samplers.QMCSampler",
})
ALLOWED_TARGETS = PROJECT_TARGETS | LIBRARY_TARGETS | HYDRA_TARGETS
TARGET_KEY = "_target_"


def _targets(node: Any, prefix: str):
    """``(dotted key, value)`` of every ``_target_`` in a plain or OmegaConf container (unresolved)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, Mapping):
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == TARGET_KEY:
                yield name, value
            else:
                yield from _targets(value, name)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _targets(value, f"{prefix}[{i}]")


def check_target(key: str, value: Any, where: str = "") -> None:
    """``ValueError`` unless ``value`` is one of ``ALLOWED_TARGETS``."""
    if isinstance(value, str) and value in ALLOWED_TARGETS:
        return
    source = f" in {where}" if where else ""
    raise ValueError(f"{key}={value!r}{source} is not allowed; allowed: {sorted(ALLOWED_TARGETS)} (presets and "
                     "configs are code: a _target_ is imported and called, so only these named classes are)")


def check_targets(data: Any, where: str = "", prefix: str = "") -> None:
    """Every ``_target_`` of ``data`` (a job config, a preset, a restored ``config_resolved.yaml``) is
    allowed; ``where`` names the source in the error (e.g. the file)."""
    for key, value in _targets(data, prefix):
        check_target(key, value, where)


def check_hydra_node(config: Any) -> None:
    """The ``hydra`` node of a composed config: every ``_target_`` allowed, no Optuna
    ``custom_search_space`` (a callable named by text)."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.select(config, "hydra") if OmegaConf.is_config(config) else (config or {}).get("hydra")
    if hydra is None:
        return
    check_targets(hydra, prefix="hydra")
    custom = OmegaConf.select(config, "hydra.sweeper.custom_search_space", default=None) \
        if OmegaConf.is_config(config) else None
    if custom is not None:
        raise ValueError(f"hydra.sweeper.custom_search_space={custom!r} is not allowed; allowed: null (it names a "
                         "function that the sweeper imports and calls)")


class HydraNodeError(CompactHydraException, ValueError):
    """A ``hydra`` node that names a target outside the allowlist (Hydra prints the message alone)."""


@functools.cache
def guard_hydra_callbacks() -> None:
    """Check the ``hydra`` node before Hydra instantiates the callbacks (once per process)."""
    from hydra._internal import callbacks

    original = callbacks.Callbacks.__init__

    @functools.wraps(original)
    def checked_init(self, config=None, *args, **kwargs):
        if config is not None:
            try:
                check_hydra_node(config)
            except ValueError as err:
                raise HydraNodeError(str(err)) from None
        original(self, config, *args, **kwargs)

    callbacks.Callbacks.__init__ = checked_init
