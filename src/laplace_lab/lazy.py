"""Module attributes imported on first use (PEP 562), for names whose modules are slow to import
(Lightning, torchvision, pandas / matplotlib)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(module_name: str, sources: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` for ``module_name``: ``name`` in ``sources`` is imported from the
    module ``sources[name]`` on first use; any other name raises ``AttributeError``."""

    def __getattr__(name: str):
        if name in sources:
            return getattr(importlib.import_module(sources[name]), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
