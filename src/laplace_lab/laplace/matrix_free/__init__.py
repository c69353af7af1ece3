"""Matrix-free Laplace: GGN-vector products, Lanczos, CG, low-rank and sample-based
linearised posteriors. Everything is chunked over the data and runs on the parameters' device.

- ``GGNOperator``: ``V -> sum_n J_n^T M_n J_n V`` by torch.func jvp/vjp.
- ``lanczos``: top-k eigenpairs with full reorthogonalisation.
- ``cg``: batched preconditioned conjugate gradients.
- ``LowRankStructure``: ``Laplace(..., hessian_structure="lowrank", n_eigs=k)``.
- ``sampling``: sample-then-optimise posterior samples by CG, sampled linearised predictive,
  Hutchinson estimate of the evidence gradient w.r.t. log prior precision.
"""

from laplace_lab.laplace.matrix_free.cg import CGResult, cg, jacobi
from laplace_lab.laplace.matrix_free.ggn_operator import GGNOperator
from laplace_lab.laplace.matrix_free.lanczos import lanczos
from laplace_lab.laplace.matrix_free.lowrank import (
    LowRankStructure,
    functional_variance_jvp,
    functional_variance_lowrank,
)
from laplace_lab.laplace.matrix_free.sampling import (
    ggn_operator,
    linearised_samples,
    log_prior_precision_grad,
    lowrank_preconditioner,
    posterior_samples,
    sampled_predictive,
)

__all__ = ["GGNOperator", "lanczos", "cg", "CGResult", "jacobi", "LowRankStructure",
           "functional_variance_jvp", "functional_variance_lowrank", "ggn_operator", "posterior_samples",
           "linearised_samples", "sampled_predictive", "log_prior_precision_grad", "lowrank_preconditioner"]
