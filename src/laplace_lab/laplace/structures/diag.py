"""Diagonal curvature: ``h = diag(H)`` ``[P]`` (hand-written kernels in ``modules.diag_sq``)."""

from __future__ import annotations

import torch

from laplace_lab.laplace.modules import diag_sq
from laplace_lab.laplace.priors import to_diag
from laplace_lab.laplace.structures.base import Structure


class DiagStructure(Structure):
    name = "diag"

    def reset(self):
        self.h = torch.zeros(self.n_params, device=self.device, dtype=self.dtype)

    def accumulate(self, records):
        parts = []
        for e, r in zip(self.entries, records):
            if not r.calls:
                parts += [torch.zeros_like(p).reshape(-1) for p in e.params]
                continue
            d = diag_sq(e.module, e.names, r.calls)
            parts += [d[n].reshape(-1) for n in e.names]
        self.h += torch.cat(parts)

    def precision(self, c, prior):
        """``[P]`` diagonal posterior precision."""
        return c * self.h + to_diag(prior, self.sizes)

    def logdet(self, c, prior):
        return self.precision(c, prior).log().sum()

    def sample(self, n, c, prior, generator=None):
        return self._randn(n, self.n_params, generator=generator) * self.precision(c, prior).rsqrt()

    def functional_variance(self, Js, c, prior):
        return torch.einsum("ncp,nkp->nck", Js / self.precision(c, prior), Js)

    def posterior_variance(self, c, prior):
        return 1.0 / self.precision(c, prior)

    def dense_precision(self, c, prior):
        return torch.diag(self.precision(c, prior))

    def state_dict(self):
        return {"h": self.h}

    def load_state_dict(self, sd):
        self.h = sd["h"].to(self.device, self.dtype)
