"""laplace-lab: Laplace approximations for Bayesian deep learning.

Packages, from the entry point down (each imports only the ones below it; ``tests/test_architecture.py``
checks it): ``train`` (the Hydra entry point), ``reporting`` (tables, reference verdicts, provenance,
figures, run loggers), ``training``, ``sweeps`` (resumable multiruns), ``config`` (the typed schema and its validation),
``evaluation``, ``data`` and ``models``, ``laplace`` (the engine, pure PyTorch) and ``io`` (pure Python
helpers every layer uses, the engine included: atomic file writes, declared options ``io.fields``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(module_name: str, sources: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` (PEP 562) for ``module_name``: ``name`` in ``sources`` is imported
    from the module ``sources[name]`` on first use, for names whose modules are slow to import
    (Lightning, torchvision, pandas / matplotlib); any other name raises ``AttributeError``."""

    def __getattr__(name: str):
        if name in sources:
            return getattr(importlib.import_module(sources[name]), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
