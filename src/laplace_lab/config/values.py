"""Value checks of the whole job config and of the groups typed by a constructor, run before any
data is loaded (``check_values``; ``config.load`` calls it before it builds the typed schema).

- every number is finite (``nan`` / ``inf`` rejected anywhere);
- every ``_target_`` is one a slot of ``config.targets.SLOTS`` takes (a config is code: a command-line
  ``_target_`` override could import and run anything);
- ``data``: its class declares its options (``LabDataModule.Options``: type, default, range or
  choices, once) and size limits (``check_sizes``: toy2d's classes, a fifth of an image set to
  validation); ``data.registry.check_data`` reads the node against them;
- ``model``: the network's class declares its options the same way (``LabModel.Options``);
  ``models.registry.check_model`` reads the node against them;
- the other ``_target_`` groups (``optimizer``, ``lr_scheduler``) and the Lightning
  arguments of ``trainer``: their schema is the constructor's signature. No unknown keys, also when
  added with ``+`` (``+optimizer.lrr=0.1``); an option's type matches its defaults in
  ``conf/<group>/*.yaml`` or the signature (``optimizer.lr='0.1'`` is an error); the
  options of ``RANGES`` lie in their range. The root keys and the other groups: ``config.schema``.

Each check raises ``ValueError`` naming the option and the allowed values.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from laplace_lab.config import CONF_DIR
from laplace_lab.config.targets import allowed_targets, check_targets
from laplace_lab.data.registry import check_data
from laplace_lab.io.fields import Spec, check, type_name
from laplace_lab.models.registry import check_model

# Groups typed by a constructor (data and model: by their class's Options; the other groups:
# config.schema); trainer: Lightning's Trainer.
CHECKED_GROUPS = ("optimizer", "lr_scheduler", "trainer")
# Keys of ours inside a group whose other keys are a constructor's arguments (trainer: Lightning's Trainer).
OWN_KEYS = {"trainer": ("loop",)}

# Ranges of the options of the torch and Lightning targets (their classes are not ours to declare
# them on; the data modules and the networks declare theirs on the class, the other groups in
# config.schema).
RANGES: dict[str, Spec] = {
    "optimizer.lr": Spec("float", low=0, low_open=True, describe=" (the learning rate)"),
    "optimizer.momentum": Spec("float", low=0, high=1),
    "optimizer.eps": Spec("float", low=0, low_open=True),
    "lr_scheduler.T_max": Spec("int", low=1),
    "lr_scheduler.eta_min": Spec("float", low=0),
    "trainer.check_val_every_n_epoch": Spec("int", low=1, nullable=True),  # a Trainer argument outside TrainerConfig
}


def _fail(message: str) -> None:
    raise ValueError(message)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _leaves(node: Any, prefix: str = ""):
    """``(dotted key, value)`` of every leaf of a container (lists give ``key[i]``)."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, node


def check_finite(data: Mapping) -> None:
    """No ``nan`` / ``inf`` anywhere in the job config."""
    for key, value in _leaves(data):
        if isinstance(value, float) and not math.isfinite(value):
            _fail(f"{key}={value} is not a finite number; allowed: finite values only (nan and inf are rejected)")


def check_ranges(data: Mapping) -> None:
    """The options of ``RANGES``: numbers (ints where ``int``) in their range."""
    for key, spec in RANGES.items():
        value, found = _select(data, key)
        if found:
            check(key, value, spec)


def _select(data: Mapping, key: str) -> tuple[Any, bool]:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None, False
        node = node[part]
    return node, True


# --- known keys and their types --------------------------------------------------------------
def _type_class(v: Any) -> str | None:
    """``bool`` | ``number`` | ``str`` | ``list`` | ``dict``; None for null and interpolations."""
    if isinstance(v, str) and "${" in v:
        return None
    kind = type_name(v)
    return kind if kind in ("bool", "number", "str", "list", "dict") else None


def _record(schema: dict[str, set], key: str, value: Any) -> None:
    kinds = schema.setdefault(key, set())
    kind = _type_class(value)
    if kind == "list" and value and all(isinstance(e, int) and not isinstance(e, bool) for e in value):
        kind = "list[int]"
    if kind:
        kinds.add(kind)
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record(schema, f"{key}.{k}", v)


@functools.cache
def group_schema(group: str) -> dict[str, frozenset]:
    """Known keys of ``group`` (dotted, relative to it) and the type classes of their defaults
    in the group's option files (``conf/<group>/*.yaml``; trainer: ``config.schema.TrainerConfig``)."""
    schema: dict[str, set] = {}
    if group == "trainer":  # our own keys: config.schema
        from laplace_lab.config.schema import TrainerConfig
        from laplace_lab.io.fields import defaults

        nodes = [defaults(TrainerConfig)]
    else:
        nodes = [OmegaConf.to_container(OmegaConf.load(p), resolve=False) for p in sorted((CONF_DIR / group).glob("*.yaml"))]
    for node in nodes:
        for key, value in (node or {}).items():
            if key != "defaults":
                _record(schema, key, value)
    if group == "trainer":  # options of kind "any" (devices: int, "auto" or a list): their Spec checks them
        for f in dataclasses.fields(TrainerConfig):
            if "spec" in f.metadata and f.metadata["spec"].kind == "any":
                schema[f.name] = set()
    return {k: frozenset(v) for k, v in schema.items()}


def _target_class(group: str, node: Mapping) -> Any:
    if group == "trainer":
        if set(node) <= set(group_schema("trainer")):  # our option files' keys: known without importing Lightning
            return None
        import pytorch_lightning as pl

        return pl.Trainer
    target = node.get("_target_")
    if not isinstance(target, str):
        return None
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        _fail(f"{group}._target_={target!r} cannot be imported; allowed: {sorted(allowed_targets())}")


def _accepted_args(cls: Any) -> dict[str, inspect.Parameter] | None:
    """Constructor parameters of ``cls`` following ``**kwargs`` up the MRO; None if it takes
    ``**kwargs`` that end nowhere we can see (accept anything)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in inspect.getmro(cls) if inspect.isclass(cls) else (cls,):
        init = klass.__init__ if inspect.isclass(klass) else klass
        if inspect.isclass(klass) and "__init__" not in vars(klass):
            continue
        try:
            signature = inspect.signature(init)
        except (TypeError, ValueError):
            return None
        has_var_kw = False
        for name, p in signature.parameters.items():
            if p.kind == p.VAR_KEYWORD:
                has_var_kw = True
            elif p.kind != p.VAR_POSITIONAL and name != "self":
                params.setdefault(name, p)
        if not has_var_kw:
            return params
        if not inspect.isclass(cls) or klass is object:
            return None
    return None


def check_group_keys(data: Mapping) -> None:
    """Unknown keys and mistyped values under the groups of ``CHECKED_GROUPS``. A group with a
    ``_target_`` knows its target's constructor arguments; the others, the keys of their options."""
    for group in CHECKED_GROUPS:
        node = data.get(group)
        if not isinstance(node, Mapping):
            continue
        schema = dict(group_schema(group))
        cls = _target_class(group, node)
        args = _accepted_args(cls) if cls is not None else None
        for name, p in (args or {}).items():
            if name not in schema and p.default is not inspect.Parameter.empty:
                _record(schema, name, p.default)
        known = set(args) | set(OWN_KEYS.get(group, ())) if args is not None else set(schema)
        for key, value in _flat_keys(node):
            top = key.split(".")[0]
            if top.startswith("_") and top.endswith("_"):
                continue
            if (key if args is None else top) not in known and not (cls is not None and args is None):
                allowed = sorted(k for k in known if k.count(".") == key.count("."))
                _fail(f"{group}.{key} is not a known option of the {group} group; allowed: {allowed}")
            _check_type(f"{group}.{key}", value, frozenset(schema.get(key, ())))


def _flat_keys(node: Mapping, prefix: str = ""):
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        yield key, v
        if isinstance(v, Mapping) and not str(k).startswith("_"):
            yield from _flat_keys(v, key)


def _check_type(name: str, value: Any, kinds: frozenset) -> None:
    kind = _type_class(value)
    if kind is None or not kinds:
        return
    base = {k.split("[")[0] for k in kinds}
    if kind not in base:
        _fail(f"{name}={value!r} has the wrong type: got a {kind}; allowed: a {' or '.join(sorted(base))}"
              + (" (write a list as [a, b], not as a string)" if "list" in base else ""))
    if kind == "list" and "list[int]" in kinds and "list" not in kinds:
        bad = [e for e in value if not (isinstance(e, int) and not isinstance(e, bool))]
        if bad:
            _fail(f"{name}={list(value)!r} must be a list of integers; got entries {bad}")




def check_values(data: Mapping) -> None:
    """All value checks above, on the resolved job config (a plain mapping, no ``hydra`` node)."""
    check_targets(data)
    check_finite(data)
    if isinstance(data.get("data"), Mapping):
        check_data(data["data"])
    if isinstance(data.get("model"), Mapping):
        check_model(data["model"])
    check_group_keys(data)
    check_ranges(data)
