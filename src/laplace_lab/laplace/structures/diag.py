"""Diagonal curvature: ``h = diag(H)`` ``[P]`` (hand-written kernels in ``modules.diag_sq``)."""

from __future__ import annotations

import torch

from laplace_lab.laplace.modules import diag_sq
from laplace_lab.laplace.plan_terms import MemoryPlan, backend_batch_bytes, glm_bytes_per_input
from laplace_lab.laplace.priors import logdet_diag_by_tensor, to_diag
from laplace_lab.laplace.structures.base import Structure, register


@register
class DiagStructure(Structure):
    supports_fused = True
    factor_chunks = True
    name = "diag"
    label = "diagonal"
    shard_reduction = "sum"

    def reset(self):
        self.h = torch.zeros(self.n_params, device=self.device, dtype=self.dtype)

    def accumulate(self, records, inputs: bool = True):  # factor_chunks: entries without calls add nothing
        start = 0
        for e, r in zip(self.entries, records):
            d = diag_sq(e.module, e.names, r.calls) if r.calls else {}
            for n in e.names:
                size = getattr(e.module, n).numel()
                if n in d:
                    self.h[start:start + size] += d[n].reshape(-1)
                start += size

    def load_layer_curvature(self, parts: list[torch.Tensor]) -> None:
        """``parts[i]``: entry i's diagonal, flattened in parameter order (``[P_i]``)."""
        h = torch.cat([part.reshape(-1) for part in parts])
        if h.numel() != self.n_params:
            raise ValueError(f"load_layer_curvature: {h.numel()} diagonal entries for {self.n_params} parameters")
        self.h = h.to(self.h.dtype)

    def shard_sums(self):
        return {"h": self.h}

    @property
    def H(self) -> torch.Tensor:
        """``[P]`` curvature diagonal."""
        return self.h

    def curvature_eigenvalues(self) -> torch.Tensor:
        return self.h

    def square_norm(self, v, c, prior):
        return (self.precision(c, prior) * v) @ v

    def posterior_view(self, la):
        from laplace_lab.laplace.functional_variance import LayerwiseView

        var = 1.0 / self.precision(la.H_factor, la.structure_prior)
        return LayerwiseView(la, torch.split(var, self.sizes))

    def precision(self, c, prior):
        """``[P]`` diagonal posterior precision."""
        return c * self.h + to_diag(prior, self.sizes)

    def logdet(self, c, prior):
        return self.precision(c, prior).log().sum()

    def logdet_by_tensor(self, c, prior):
        return logdet_diag_by_tensor(self.precision(c, prior), self.sizes)

    def sample(self, n, c, prior, generator=None):
        return self.randn(n, self.n_params, generator=generator) * self.precision(c, prior).rsqrt()

    def functional_variance(self, Js, c, prior):
        return torch.einsum("ncp,nkp->nck", Js / self.precision(c, prior), Js)

    def posterior_variance(self, c, prior):
        return 1.0 / self.precision(c, prior)

    def dense_precision(self, c, prior):
        return torch.diag(self.precision(c, prior))

    # ---- memory plan (laplace.plan) --------------------------------------------------------
    @classmethod
    def memory_plan(cls, shape, batch, n_factors, options):
        """``h`` ``[P]``; accumulation squares a Linear's output gradients (``K N`` rows, one layer
        at a time; other layers: the diag kernels' chunks); predictive and samples: ``[P]`` vectors."""
        from laplace_lab.laplace.modules import CHUNK_FLOATS
        b, P = shape.itemsize, shape.n_params
        parts = backend_batch_bytes(shape, batch, n_factors, cls.factor_chunks)
        square = max([lay.out_numel for lay in shape.layers if lay.kfac and lay.positions == 1], default=0)
        parts |= {"diagonal [P]": b * P, "squared gradients": b * (square * batch * n_factors + CHUNK_FLOATS)}
        return MemoryPlan(state=b * P, fit=sum(parts.values()), predict_fixed=2 * b * P,
                          predict_per_input=glm_bytes_per_input(shape), sample_fixed=b * P,
                          sample_per_draw=2 * b * P, parts=parts)

    def state_dict(self):
        return {"h": self.h}

    def load_state_dict(self, sd):
        self.h = sd["h"].to(self.device, self.dtype)
