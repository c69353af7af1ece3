"""Backend "capture": forward hooks record module inputs, one autograd backward of the ``K`` output
factors gives the output gradients (``laplace.capture.Capture``). Any model; ``auto``'s fallback."""

from __future__ import annotations

import torch

from laplace_lab.laplace.backends.base import Backend, register
from laplace_lab.laplace.capture import Capture, has_inplace_modules
from laplace_lab.laplace.curvature import output_factors


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
        cap.backward(out, V.reshape(V.shape[0], *out.shape))
        return f.detach(), yy, cap.records
