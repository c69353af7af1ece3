"""``LaplaceSpec``: the engine's option names and compatibility rules, asked by config validation.

One source: choices come from ``options`` (``str`` enums) and the structure registry
(``structures.STRUCTURES``), rules from each structure's declared ``prior_structures``,
``curvature_types``, ``options`` and ``check_options``. ``keys`` maps an option to the name the caller
shows in messages (e.g. ``"hessian_structure" -> "curvature.hessian_structure"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laplace_lab.laplace.options import CurvatureType, PriorStructure, SubsetOfWeights

LAYERWISE_EXPANDED = {"normgroups": "layerwise"}  # priors the structures see in expanded form


def hessian_structures() -> tuple[str, ...]:
    """Registered structure names (importing the engine registers the built-in ones; a module new on
    the ``structures`` package's path is imported by ``structures.discover``)."""
    import laplace_lab.laplace  # noqa: F401  (registers full, diag, kron, lowrank)
    from laplace_lab.laplace.structures import discover

    return discover()


def structure_class(name: str):
    from laplace_lab.laplace.structures import STRUCTURES

    hessian_structures()
    return STRUCTURES[name]


def allowed_priors(structure: str) -> tuple[str, ...]:
    supported = structure_class(structure).prior_structures
    return tuple(p for p in PriorStructure.values() if LAYERWISE_EXPANDED.get(p, p) in supported)


@dataclass
class LaplaceSpec:
    subset_of_weights: str = "last_layer"
    hessian_structure: str = "kron"
    curvature: str = "ggn"
    prior_structure: str = "scalar"
    options: dict = field(default_factory=dict)  # structure options, e.g. {"n_eigs": 20} (their declarations: the structure class's ``Options``)
    keys: dict = field(default_factory=dict)

    def _key(self, option: str) -> str:
        return self.keys.get(option, option)

    def _choice(self, option: str, allowed) -> str:
        value = getattr(self, option)
        value = getattr(value, "value", value)
        if value not in allowed:
            raise ValueError(f"{self._key(option)}={value!r} is not supported; allowed: {list(allowed)}")
        return value

    def validate(self) -> LaplaceSpec:
        """``ValueError`` naming the option and the allowed values for the first bad choice or combination."""
        self._choice("subset_of_weights", SubsetOfWeights.values())
        structure = self._choice("hessian_structure", hessian_structures())
        curvature = self._choice("curvature", CurvatureType.values())
        prior = self._choice("prior_structure", PriorStructure.values())
        cls = structure_class(structure)
        hs, pk, ck = self._key("hessian_structure"), self._key("prior_structure"), self._key("curvature")
        priors = allowed_priors(structure)
        if prior not in priors:
            raise ValueError(f"{pk}={prior!r} does not fit {hs}={structure!r}; allowed with {structure}: {list(priors)}")
        if curvature not in cls.curvature_types:
            raise ValueError(f"{hs}={structure!r} needs {ck} in {list(cls.curvature_types)}; got {curvature!r}")
        cls.check_options(self.options, key=lambda k: self.keys.get(k, k))
        return self
