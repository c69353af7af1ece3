"""Common interface of the posterior structures.

Notation: ``P`` = number of parameters in the subset, ``L`` = number of parameter tensors,
``c = 1 / (sigma^2 T)`` the curvature scale, ``prior``: ``[1]``, ``[L]`` or ``[P]`` precisions.
The posterior precision is ``c H + diag(prior)``.
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.capture import Record
from laplace_lab.laplace.subset import Entry


class Structure:
    name = ""
    prior_structures: tuple[str, ...] = ("scalar", "layerwise", "diagonal")

    def __init__(self, entries: list[Entry], device, dtype):
        self.entries = entries
        self.shapes = [p.shape for e in entries for p in e.params]
        self.sizes = [s.numel() for s in self.shapes]
        self.n_params = sum(self.sizes)
        self.device, self.dtype = device, dtype
        self.reset()

    # ---- fitting ---------------------------------------------------------------------------
    def reset(self) -> None:
        raise NotImplementedError

    def accumulate(self, records: list[Record]) -> None:
        """Add one batch; ``records[i]`` holds the calls of ``entries[i].module`` with grads."""
        raise NotImplementedError

    def finalize(self) -> None:
        """Called once after the data pass (decompositions that queries reuse)."""

    # ---- queries ---------------------------------------------------------------------------
    def logdet(self, c: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        """``log det (c H + diag(prior))``, differentiable in ``c`` and ``prior``."""
        raise NotImplementedError

    def sample(self, n: int, c, prior, generator=None) -> torch.Tensor:
        """``[n, P]`` zero-mean draws from ``N(0, (c H + diag(prior))^{-1})``."""
        raise NotImplementedError

    def functional_variance(self, Js: torch.Tensor, c, prior) -> torch.Tensor:
        """``J Sigma J^T`` for ``Js`` ``[N, C, P]`` -> ``[N, C, C]``."""
        raise NotImplementedError

    def posterior_variance(self, c, prior) -> torch.Tensor:
        """``[P]`` marginal variances (diagonal of the covariance)."""
        raise NotImplementedError

    def dense_precision(self, c, prior) -> torch.Tensor:
        """``[P, P]`` posterior precision as a dense matrix (small models / tests only)."""
        raise NotImplementedError

    def precision(self, c, prior):
        """The posterior precision in the structure's own form (full: [P, P]; diag: [P]; kron: a view)."""
        raise NotImplementedError

    def square_norm(self, v: torch.Tensor, c, prior) -> torch.Tensor:
        """``v^T (c H + diag(prior)) v`` for ``v`` ``[P]`` (default: the dense precision; small models)."""
        return v @ (self.dense_precision(c, prior) @ v)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, sd: dict) -> None:
        raise NotImplementedError

    # ---- helpers ---------------------------------------------------------------------------
    def _randn(self, *shape, generator=None):
        return torch.randn(*shape, generator=generator, device=self.device, dtype=self.dtype)
