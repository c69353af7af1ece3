"""The data modules of the ``data`` config group, found by their class, not by a list of names.

A data module is a ``LabDataModule`` subclass defined in a module of this package; its ``_target_``
is ``target_of(cls)``: ``laplace_lab.data.<Class>`` where the package exports it, else
``laplace_lab.data.<module>.<Class>`` (a new file needs no export). Everything the config needs to
know about it is declared on the class (``LabDataModule``: ``Options``, ``in_memory``,
``validation_option``, ``images``, ``check_sizes``), so a new data set is its class and its yaml in
``conf/data/``.

- ``data_class(target)``: the class a ``data._target_`` names, or ``None`` (not a data module of
  this package: ``config.targets`` refuses it).
- ``data_modules()``: ``{target: class}`` of every data module (imports every module of the
  package; for the allowed values of an error message).
- ``check_data(node)``: a ``data`` node's options against its class (unknown keys, types, ranges,
  then the size limits), before any data loads; returns the typed ``Options``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from laplace_lab.data.base import LabDataModule

PACKAGE = __name__.rpartition(".")[0]  # laplace_lab.data


def target_of(cls: type) -> str:
    """The ``_target_`` that names data module ``cls``."""
    package = importlib.import_module(PACKAGE)
    if getattr(package, cls.__name__, None) is cls:
        return f"{PACKAGE}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_data_module(obj: Any) -> bool:
    return (inspect.isclass(obj) and issubclass(obj, LabDataModule) and obj is not LabDataModule
            and obj.__module__.startswith(f"{PACKAGE}."))


def data_class(target: Any) -> type[LabDataModule] | None:
    """The data module ``target`` names (``target_of`` of it, exactly), else ``None``. Only modules
    of this package are imported."""
    if not isinstance(target, str) or not target.startswith(f"{PACKAGE}."):
        return None
    module, _, name = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return obj if _is_data_module(obj) and target_of(obj) == target else None


def data_modules(where: Callable[[type[LabDataModule]], bool] = lambda cls: True) -> dict[str, type[LabDataModule]]:
    """``{target: class}`` of every data module of the package for which ``where(cls)`` holds."""
    package = importlib.import_module(PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(package.__path__, f"{PACKAGE}."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if _is_data_module(obj) and obj.__module__ == module.__name__ and where(obj):
                found[target_of(obj)] = obj
    return dict(sorted(found.items()))


def required_class(node: Mapping[str, Any]) -> type[LabDataModule]:
    """The class of a ``data`` node whose ``_target_`` passed ``config.targets`` (``ValueError`` otherwise)."""
    cls = data_class(node.get("_target_"))
    if cls is None:
        raise ValueError(f"data._target_={node.get('_target_')!r} is not a data module; allowed: {list(data_modules())}")
    return cls


def check_data(node: Mapping[str, Any]) -> LabDataModule.Options:
    """The options of a ``data`` node (keys other than ``_target_``-like ``_x_``) read into its class's
    ``Options`` and checked against its size limits; ``ValueError`` names the option."""
    cls = required_class(node)
    options = cls.read_options({k: v for k, v in node.items() if not (str(k).startswith("_") and str(k).endswith("_"))})
    cls.check_sizes(options)
    return options
