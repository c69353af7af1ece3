"""laplace-torch names over the engine, for users switching by one import.

``FullLaplace``, ``KronLaplace``, ``DiagLaplace``, ``LowRankLaplace`` (all weights) and
``FullLLLaplace``, ``KronLLLaplace``, ``DiagLLLaplace`` (last layer) are ``Laplace`` with
``subset_of_weights`` / ``hessian_structure`` fixed; every other keyword is ``Laplace``'s.
The backend classes (``CurvlinopsGGN``, ``AsdlEF``, ...) are markers for ``Laplace(backend=...)``:
each names the curvature (``ggn`` | ``ef``) the engine computes itself; they run no third-party code.
Deliberate deviations from laplace-torch are listed in ``docs/laplace_torch_compat.md``.
"""

from __future__ import annotations

from laplace_lab.laplace.laplace import Laplace


class _Flavour(Laplace):
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
ParametricLaplace = BaseLaplace = Laplace
LLLaplace = Laplace


class CurvatureBackend:
    """Marker for ``Laplace(backend=...)``: ``curvature`` is the engine's curvature name."""

    curvature = ""


def _backend(name: str, curvature: str) -> type:
    return type(name, (CurvatureBackend,), {"curvature": curvature,
                                            "__doc__": f"Marker: ``curvature={curvature!r}``."})


CurvlinopsGGN, CurvlinopsEF = _backend("CurvlinopsGGN", "ggn"), _backend("CurvlinopsEF", "ef")
AsdlGGN, AsdlEF = _backend("AsdlGGN", "ggn"), _backend("AsdlEF", "ef")
BackPackGGN, BackPackEF = _backend("BackPackGGN", "ggn"), _backend("BackPackEF", "ef")

__all__ = ["Laplace", "BaseLaplace", "ParametricLaplace", "LLLaplace", "FullLaplace", "KronLaplace",
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
