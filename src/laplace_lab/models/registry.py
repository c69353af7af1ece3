"""The networks of the ``model`` config group, found by their class (``LabModel`` subclasses of
this package; ``io.declare.Registry``, as the data modules).

- ``model_class(target)``: the class a ``model._target_`` names, or ``None``.
- ``check_model(node)``: a ``model`` node's options read into its class's ``Options`` (unknown keys,
  types, ranges and choices), before any data loads; returns the typed ``Options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laplace_lab.io.declare import Registry
from laplace_lab.models.base import LabModel

REGISTRY = Registry(__name__.rpartition(".")[0], LabModel, "model")


def model_class(target: Any) -> type[LabModel] | None:
    """The network ``target`` names (``laplace_lab.models.MLP``), else ``None``."""
    return REGISTRY.find(target)


def check_model(node: Mapping[str, Any]) -> Any:
    """The options of a ``model`` node (keys other than Hydra's ``_x_``) read into its class's ``Options``."""
    return REGISTRY.check(node)
