"""laplace-torch names over the engine, for users switching by one import.

``Laplace(model, likelihood, subset_of_weights, hessian_structure, ...)`` returns one of
``FullLaplace``, ``KronLaplace``, ``DiagLaplace``, ``LowRankLaplace`` (all weights) and
``FullLLLaplace``, ``KronLLLaplace``, ``DiagLLLaplace`` (last layer) are ``Laplace`` with
``subset_of_weights`` / ``hessian_structure`` fixed; every other keyword is ``Laplace``'s.
The backend classes (``CurvlinopsGGN``, ``AsdlEF``, ...) are markers for ``Laplace(backend=...)``:
each names the curvature (``ggn`` | ``ef``) the engine computes itself; they run no third-party code.
Deliberate deviations from laplace-torch are listed in ``docs/laplace_torch_compat.md``.
"""

from __future__ import annotations

from laplace_lab.laplace.laplace import Laplace as _Laplace


class _Flavour(_Laplace):
    subset_of_weights_default = "all"
    hessian_structure_default = "full"

    def __init__(self, model, likelihood, **kwargs):
        for key in ("subset_of_weights", "hessian_structure"):
            if key in kwargs:
                raise TypeError(f"{type(self).__name__} fixes {key}; use Laplace(...) to choose it")
        super().__init__(model, likelihood, subset_of_weights=self.subset_of_weights_default,
                         hessian_structure=self.hessian_structure_default, **kwargs)


def _flavour(name: str, subset: str, structure: str) -> type:
    return type(name, (_Flavour,), {"subset_of_weights_default": subset, "hessian_structure_default": structure,
                                    "__doc__": f"``Laplace(subset_of_weights={subset!r}, "
                                               f"hessian_structure={structure!r})``."})


FullLaplace = _flavour("FullLaplace", "all", "full")
KronLaplace = _flavour("KronLaplace", "all", "kron")
DiagLaplace = _flavour("DiagLaplace", "all", "diag")
LowRankLaplace = _flavour("LowRankLaplace", "all", "lowrank")
FullLLLaplace = _flavour("FullLLLaplace", "last_layer", "full")
KronLLLaplace = _flavour("KronLLLaplace", "last_layer", "kron")
DiagLLLaplace = _flavour("DiagLLLaplace", "last_layer", "diag")
ParametricLaplace = BaseLaplace = LLLaplace = _Flavour
_FLAVOURS = {(f.subset_of_weights_default, f.hessian_structure_default): f
             for f in (FullLaplace, KronLaplace, DiagLaplace, LowRankLaplace, FullLLLaplace, KronLLLaplace,
                       DiagLLLaplace)}
Engine = _Laplace


def Laplace(model, likelihood, subset_of_weights="last_layer", hessian_structure="kron", **kwargs) -> _Flavour:
    """laplace-torch's factory: the flavour class of ``(subset_of_weights, hessian_structure)``."""
    key = (str(subset_of_weights), str(hessian_structure))
    if key not in _FLAVOURS:
        raise ValueError(f"(subset_of_weights, hessian_structure) must be one of {sorted(_FLAVOURS)}; got {key}")
    return _FLAVOURS[key](model, likelihood, **kwargs)


class CurvatureBackend:
    """Marker for ``Laplace(backend=...)``: ``curvature`` is the engine's curvature name."""

    curvature = ""


def _backend(name: str, curvature: str) -> type:
    return type(name, (CurvatureBackend,), {"curvature": curvature,
                                            "__doc__": f"Marker: ``curvature={curvature!r}``."})


CurvlinopsGGN, CurvlinopsEF = _backend("CurvlinopsGGN", "ggn"), _backend("CurvlinopsEF", "ef")
AsdlGGN, AsdlEF = _backend("AsdlGGN", "ggn"), _backend("AsdlEF", "ef")
BackPackGGN, BackPackEF = _backend("BackPackGGN", "ggn"), _backend("BackPackEF", "ef")

__all__ = ["Laplace", "Engine", "BaseLaplace", "ParametricLaplace", "LLLaplace", "FullLaplace", "KronLaplace",
           "DiagLaplace", "LowRankLaplace", "FullLLLaplace", "KronLLLaplace", "DiagLLLaplace",
           "CurvatureBackend", "CurvlinopsGGN", "CurvlinopsEF", "AsdlGGN", "AsdlEF", "BackPackGGN", "BackPackEF"]

from laplace_lab.laplace.options import (  # noqa: E402  (laplace-torch exposes its enums here too)
    FeatureReduction,
    HessianStructure,
    Likelihood,
    LinkApprox,
    PredType,
    PriorStructure,
    SubsetOfWeights,
    TuningMethod,
)

__all__ += ["FeatureReduction", "HessianStructure", "Likelihood", "LinkApprox", "PredType", "PriorStructure",
            "SubsetOfWeights", "TuningMethod"]
