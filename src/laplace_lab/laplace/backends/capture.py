"""Backend "capture": forward hooks record module inputs, one autograd backward of the ``K`` output
factors gives the output gradients (``laplace.capture.Capture``). Any model; ``auto``'s fallback.

Memory: the ``K`` factors' gradients of every recorded module output are ``K`` times the network's
activations (WRN-16-4 on 32x32 images, ``K = 9``: 2.4 MB per image and factor, 680 MB for a batch of
32 on top of the graph). When the structure accumulates factor by factor (``Structure.factor_chunks``:
kron, diag, full) and the factors of a batch would exceed ``FACTOR_BUDGET`` elements, the batch's
records come as ``capture.FactorChunks``: chunks of factors back-propagated and accumulated one after
the other (the graph kept until the last), so at most ``FACTOR_BUDGET`` elements of output gradients
(at least one factor's) are alive at once. Same work: on the CPU the ``K`` backward passes run one by
one anyway; on CUDA each chunk is one batched (vmapped) backward.
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.backends.base import Backend, register
from laplace_lab.laplace.capture import Capture, FactorChunks, has_inplace_modules
from laplace_lab.laplace.curvature import output_factors

FACTOR_BUDGET = 2**24  # output-gradient elements alive at once (64 MiB in float32), at least one factor's


@register
class CaptureBackend(Backend):
    name = "capture"

    def __init__(self, la):
        super().__init__(la)
        self.modules = [e.module for e in la.entries]
        self.last_layer = la.subset_of_weights == "last_layer"
        self.protect = not self.last_layer and has_inplace_modules(la.model)

    def batch(self, X, y):
        la, modules, last_layer = self.la, self.modules, self.last_layer
        with Capture(modules, protect_inplace=self.protect) as cap:
            with torch.no_grad() if last_layer else torch.enable_grad():
                out = la.model(X)
        if not last_layer and cap.modified_inplace():  # a functional in-place op: redo protected
            with Capture(modules, protect_inplace=True) as cap, torch.enable_grad():
                out = la.model(X)
        rec = cap.records[0]
        if last_layer and not (len(rec.calls) == 1 and rec.calls[0].output is out):
            # something follows the last layer: redo the forward with a graph
            with Capture(modules) as cap, torch.enable_grad():
                out = la.model(X)
        la.check_targets(out, y)
        f, yy = la.lik.prepare(out, y)
        V = output_factors(la.lik, la.curvature, f, yy, la.n_mc_samples, la.generator)
        V = V.reshape(V.shape[0], *out.shape)
        per_factor = sum(c.output.numel() for r in cap.records for c in r.calls if c.output is not out)
        chunk = max(1, FACTOR_BUDGET // max(per_factor, 1))
        if chunk < V.shape[0] and la.structure.factor_chunks:
            return f.detach(), yy, FactorChunks(cap.factor_chunks(out, V, chunk))
        cap.backward(out, V)
        return f.detach(), yy, cap.records
