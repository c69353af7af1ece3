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

The finding and the reading are ``io.declare``'s (``Registry``, ``Declared``), shared with the models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from laplace_lab.data.base import LabDataModule
from laplace_lab.io.declare import Registry

PACKAGE = __name__.rpartition(".")[0]  # laplace_lab.data
REGISTRY = Registry(PACKAGE, LabDataModule, "data module")


def target_of(cls: type) -> str:
    """The ``_target_`` that names data module ``cls``."""
    return REGISTRY.target_of(cls)


def data_class(target: Any) -> type[LabDataModule] | None:
    """The data module ``target`` names (``target_of`` of it, exactly), else ``None``. Only modules
    of this package are imported."""
    return REGISTRY.find(target)


def data_modules(where: Callable[[type[LabDataModule]], bool] = lambda cls: True) -> dict[str, type[LabDataModule]]:
    """``{target: class}`` of every data module of the package for which ``where(cls)`` holds."""
    return REGISTRY.classes(where)


def required_class(node: Mapping[str, Any]) -> type[LabDataModule]:
    """The class of a ``data`` node whose ``_target_`` passed ``config.targets`` (``ValueError`` otherwise)."""
    return REGISTRY.required(node)


def check_data(node: Mapping[str, Any]) -> LabDataModule.Options:
    """The options of a ``data`` node (keys other than ``_target_``-like ``_x_``) read into its class's
    ``Options`` and checked against its size limits; ``ValueError`` names the option."""
    options = REGISTRY.check(node)
    REGISTRY.required(node).check_sizes(options)
    return options
