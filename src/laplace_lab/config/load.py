"""``load_run_config``: a composed job config (``DictConfig`` or plain mapping) checked and read into
the typed ``schema.RunConfig``, before any data is loaded. Every bad value, unknown key or invalid
combination raises ``ValueError`` naming the option and the allowed values.

Order: the whole-config checks and the constructor-typed groups (``values.check_values``), then each
schema group (``fields.build``: unknown keys, types, ranges, choices; ``evaluation`` included), and last
the combinations of options (``validation.check_combinations``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from laplace_lab.config.paths import check_paths
from laplace_lab.config.schema import (
    GROUPS,
    TRAINER_KEYS,
    CurvatureConfig,
    LoggerConfig,
    RootOptions,
    RunConfig,
    TrainerConfig,
)
from laplace_lab.config.values import check_values
from laplace_lab.io.fields import build

# Root keys besides the options and groups: the callbacks, the preset's table and the sweep objective.
ROOT_EXTRA = ("callbacks", "aggregate", "sweep_objective")
WIRING_KEYS = ("_target_",)  # what a node that names an object holds (its options are in the groups)
TARGET_GROUPS = ("data", "model", "optimizer", "lr_scheduler")


def resolved(cfg: Any) -> dict[str, Any]:
    """The job config as a resolved plain dict, without Hydra's own node."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else _plain(cfg)
    data.pop("hydra", None)
    return data


def unresolved(cfg: Any) -> dict[str, Any]:
    """The job config as a plain dict with its interpolations (``${seed}``) kept, less Hydra's node."""
    data = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else _plain(cfg)
    data.pop("hydra", None)
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def structure_options() -> tuple[str, ...]:
    """Every registered structure's own constructor options (``curvature.<option>`` keys)."""
    from laplace_lab.laplace.spec import hessian_structures, structure_class

    return tuple(dict.fromkeys(k for name in hessian_structures() for k in structure_class(name).options))


def _curvature(node: Mapping) -> CurvatureConfig:
    extra = structure_options()
    node = dict(node)
    given = {k: node.pop(k) for k in extra if k in node}
    typed = build(CurvatureConfig, node, "curvature", extra_keys=extra)
    return dataclasses.replace(typed, structure_options=given)


def _trainer(node: Mapping) -> TrainerConfig:
    node = dict(node)
    extra = {k: node.pop(k) for k in list(node) if k not in TRAINER_KEYS}  # Lightning's: values.check_values
    return dataclasses.replace(build(TrainerConfig, node, "trainer"), extra=extra)


def _logger(node: Mapping | None) -> LoggerConfig:
    """``logger``; a ``config_resolved.yaml`` written before the loggers named their classes has
    ``logger.csv: true|false``, read as ``logger.csv.enabled``."""
    node = dict(node or {})
    if isinstance(node.get("csv"), bool):
        node["csv"] = {"enabled": node["csv"]}
    return build(LoggerConfig, node, "logger")


def _wiring(node: Any, path: str) -> dict:
    """A node that only names an object: ``{_target_: <callable>}`` (``module``, ``callbacks.<name>``)."""
    if not isinstance(node, Mapping) or not isinstance(node.get("_target_"), str):
        raise ValueError(f"{path} must be {{_target_: <class or function>}}; got {node!r}")
    unknown = sorted(set(node) - set(WIRING_KEYS))
    if unknown:
        raise ValueError(f"{path}.{unknown[0]} is not a known option of {path}; allowed: {list(WIRING_KEYS)} "
                         "(the object's options live in its config group)")
    return dict(node)


def _callbacks(node: Any) -> dict[str, dict]:
    """``callbacks``: ``{name: {_target_: factory}}``; a null entry is left out (``callbacks.<name>=null``)."""
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ValueError(f"callbacks must be a mapping of names to {{_target_: ...}}; got {node!r}")
    return {name: _wiring(n, f"callbacks.{name}") for name, n in node.items() if n is not None}


def load_run_config(cfg: Any) -> RunConfig:
    """The typed, validated config of one job (see the module docstring)."""
    from laplace_lab.config.validation import check_combinations

    data, source = resolved(cfg), unresolved(cfg)
    check_paths(data)  # names that become paths, roots not empty
    check_values(data)
    groups = {name for name in GROUPS} | set(TARGET_GROUPS)
    root = {k: v for k, v in data.items() if k not in groups and k not in ROOT_EXTRA}
    options = build(RootOptions, root, "", extra_keys=(*groups, *ROOT_EXTRA))
    typed: dict[str, Any] = {}
    for name, (cls, _) in GROUPS.items():
        node = data.get(name)
        if name == "curvature":
            typed[name] = _curvature(node or {})
        elif name == "trainer":
            typed[name] = _trainer(node or {})
        elif name == "logger":
            typed[name] = _logger(node)
        else:
            typed[name] = build(cls, node, name)
    _wiring(options.module, "module")
    run = RunConfig(
        **{f.name: getattr(options, f.name) for f in dataclasses.fields(RootOptions)}, **typed,
        data=data.get("data") or {}, model=data.get("model") or {}, optimizer=data.get("optimizer") or {},
        lr_scheduler=data.get("lr_scheduler") or None, aggregate=data.get("aggregate"),
        sweep_objective=data.get("sweep_objective"), callbacks=_callbacks(data.get("callbacks")), raw=data,
        source=source)
    check_combinations(run)
    return run


def replaced(run: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """``run`` with the dotted keys of ``changes`` set (e.g. ``{"seed": 3, "prior.prior_precision": 1.0}``),
    resolved and validated again from its unresolved config, so interpolations follow (``data.seed:
    ${seed}``), as on a composed config."""
    source = _plain(run.source)
    for key, value in changes.items():
        node = source
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return load_run_config(OmegaConf.create(source))
