"""Curvature-collection backends (``Laplace(backend=...)``), one module each; see ``backends.base``.

- ``chain``: graph-free forward + one batched backward for plain sequential networks.
- ``capture``: autograd capture (forward hooks + one backward), any model.
- ``lanczos``: the matrix-free GGN operator of self-fitting structures (``hessian_structure="lowrank"``).
- fused training-step hooks: ``laplace.fused.FusedCurvature`` (not a ``fit`` backend: it fills a
  ``Laplace`` from the training steps through ``Laplace.add_batch`` / ``structure.accumulate``).

Every module of this package is imported here, so a new backend file registers itself.
"""

import importlib
import pkgutil

from laplace_lab.laplace.backends.base import (
    AUTO_ORDER,
    BACKENDS,
    Backend,
    backend_names,
    check_structure,
    choose,
    register,
)

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["AUTO_ORDER", "BACKENDS", "Backend", "backend_names", "check_structure", "choose", "register"]
