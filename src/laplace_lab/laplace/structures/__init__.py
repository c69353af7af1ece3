"""Posterior structures: full, diagonal and Kronecker-factored (KFAC) curvature (low-rank:
``matrix_free.lowrank``), all implementing the protocol of ``structures.base`` and registered in
``STRUCTURES`` by ``@register``.

Each structure accumulates curvature batch by batch from captured module inputs and output
gradients (``accumulate``), finalises once per fit (``finalize``: e.g. KFAC eigendecompositions)
and then answers every posterior query for a given curvature scale ``c = 1 / (sigma^2 T)`` and
prior precision without another data pass.

Every module of this package is imported here (``discover``), so a new structure file registers
itself: no import or list names it.
"""

import importlib
import pkgutil

from laplace_lab.laplace.structures.base import STRUCTURES, Structure, register
from laplace_lab.laplace.structures.diag import DiagStructure
from laplace_lab.laplace.structures.full import FullStructure
from laplace_lab.laplace.structures.kron import KronStructure


def discover() -> tuple[str, ...]:
    """Import every module on this package's path (a new one registers its structures); returns
    the registered names. Idempotent: imported modules are not run again."""
    for info in pkgutil.iter_modules(__path__, f"{__name__}."):
        importlib.import_module(info.name)
    return tuple(STRUCTURES)


discover()

__all__ = ["Structure", "FullStructure", "DiagStructure", "KronStructure", "STRUCTURES", "discover", "register"]
