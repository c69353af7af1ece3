"""Backend "chain": the graph-free forward and one batched backward of the ``K`` factors for plain
sequential networks (``laplace.chain.Chain``); ``auto``'s first choice."""

from __future__ import annotations

import torch

from laplace_lab.laplace.backends.base import Backend, register
from laplace_lab.laplace.chain import Chain
from laplace_lab.laplace.output_factors import output_factors


@register
class ChainBackend(Backend):
    name = "chain"

    @staticmethod
    def _build(la):
        return Chain.build(la.model, [e.module for e in la.entries], block_order_ok=la.structure.any_block_order)

    @classmethod
    def supports(cls, la):
        if cls._build(la) is None:
            return "not a plain nn.Sequential of supported modules (chain.Chain); use backend='capture'"
        return None

    def __init__(self, la):
        super().__init__(la)
        self.chain = self._build(la)
        self.fallback: Backend | None = None  # "auto" sets the capture backend for non-tensor (dict) batches

    def batch(self, X, y):
        la = self.la
        if not isinstance(X, torch.Tensor):  # dict batches: the chain runs tensors only
            if self.fallback is None:
                raise ValueError("backend='chain' needs tensor inputs; use backend='capture' for dict batches")
            return self.fallback.batch(X, y)
        out, records = self.chain.forward(X)
        la.check_targets(out, y)
        f, yy = la.lik.prepare(out, y)
        V = output_factors(la.lik, la.curvature, f, yy, la.n_mc_samples, la.generator)
        self.chain.backward(V.reshape(V.shape[0], *out.shape))
        return f, yy, records
