"""The Laplace engine (pure PyTorch): ``from laplace_lab.laplace import Laplace``."""

from laplace_lab.laplace.laplace import Laplace
from laplace_lab.laplace.likelihoods import LIKELIHOODS
from laplace_lab.laplace.output_factors import CURVATURE_TYPES
from laplace_lab.laplace.priors import PRIOR_STRUCTURES
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.laplace.subset import SUBSETS

HESSIAN_STRUCTURES = tuple(STRUCTURES)  # built-in ones; later ``structures.register`` calls extend STRUCTURES

__all__ = ["Laplace", "LIKELIHOODS", "CURVATURE_TYPES", "PRIOR_STRUCTURES", "SUBSETS", "HESSIAN_STRUCTURES"]
