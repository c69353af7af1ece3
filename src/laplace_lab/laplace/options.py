"""The engine's option names as ``str`` enums (one source; laplace-torch's spellings).

Every member compares equal to its string (``Likelihood.CLASSIFICATION == "classification"``), so
configs and callers keep passing plain strings. Hessian structures are open: the registry
``structures.STRUCTURES`` (filled by ``structures.register``) is the source of valid names;
``HessianStructure`` lists the built-in ones.
"""

from __future__ import annotations

from enum import Enum


class Option(str, Enum):
    """A ``str`` enum whose ``str()`` is its value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Likelihood(Option):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    HETEROSCEDASTIC_REGRESSION = "heteroscedastic_regression"


class SubsetOfWeights(Option):
    ALL = "all"
    LAST_LAYER = "last_layer"


class HessianStructure(Option):
    FULL = "full"
    DIAG = "diag"
    KRON = "kron"
    LOWRANK = "lowrank"


class CurvatureType(Option):
    GGN = "ggn"
    EF = "ef"
    MC_FISHER = "mc_fisher"


class PriorStructure(Option):
    SCALAR = "scalar"
    LAYERWISE = "layerwise"
    DIAGONAL = "diagonal"
    NORMGROUPS = "normgroups"


PRIOR_STRUCTURE_ALIASES = {"diag": "diagonal"}  # laplace-torch's name for the per-parameter prior


class PredType(Option):
    GLM = "glm"
    NN = "nn"
    MAP = "map"


class LinkApprox(Option):
    PROBIT = "probit"
    MC = "mc"
    BRIDGE = "bridge"
    BRIDGE_NORM = "bridge_norm"


class HetApprox(Option):
    """Which closed-form GLM predictive a heteroscedastic Laplace gives (Immer et al. 2023's
    ``het_approx``): linearise the mean in both natural parameters, or eta1 alone."""

    MEAN = "mean"
    NATURAL = "natural"


class TuningMethod(Option):
    MARGLIK = "marglik"
    GRIDSEARCH = "gridsearch"


class FeatureReduction(Option):
    """How a last-layer input with extra dims ``[B, T, D]`` becomes ``[B, D]`` (laplace-torch's)."""

    PICK_FIRST = "pick_first"
    PICK_LAST = "pick_last"
    AVERAGE = "average"


class KfacApprox(Option):
    """KFAC of a layer with weight sharing (``S`` > 1 output positions: Conv2d, Linear on
    ``[N, T, D]``); ``x`` input patches / rows, ``g`` output gradients per factor ``k``, ``N`` data.
    The weight block is ``G (x) A``; without weight sharing all three coincide.

    - ``expand`` (default; curvlinops' ``kfac_approx="expand"``, laplace-torch's default backend
      ``CurvlinopsGGN``, ASDL): ``A = sum_{n,s} x x^T / (N S)``, ``G = sum_{k,n,s} g g^T``.
    - ``reduce`` (Eschenhagen et al. 2023; curvlinops' ``kfac_approx="reduce"``):
      ``A = sum_n xbar xbar^T / N`` with ``xbar = mean_s x``, ``G = sum_{k,n} gsum gsum^T`` with
      ``gsum = sum_s g`` (so ``G`` is the bias block's GGN).
    - ``backpack`` (BackPack's KFLR / KFAC, laplace-torch's ``BackPackGGN``; Conv2d only):
      ``A = sum_{n,s} x x^T / N`` (``S`` times expand's), ``G`` as ``reduce``.
    """

    EXPAND = "expand"
    REDUCE = "reduce"
    BACKPACK = "backpack"


def check_choice(option: str, value, allowed) -> str:
    """``value`` as a plain string if it is one of ``allowed``, else a ``ValueError`` naming both."""
    allowed = tuple(str(a) for a in allowed)
    if isinstance(value, Enum):
        value = value.value
    if value not in allowed:
        raise ValueError(f"{option} must be one of {allowed}; got {value!r}")
    return value
