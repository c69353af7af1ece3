"""Backend "capture": forward hooks record module inputs, one autograd backward of the ``K`` output
factors gives the output gradients (``laplace.capture.Capture``). Any model; ``auto``'s fallback.

Memory: the ``K`` factors' gradients of every recorded module output are ``K`` times the network's
activations (WRN-16-4 on 32x32 images, ``K = 9``: 2.4 MB per image and factor, 680 MB for a batch of
32 on top of the graph). When they would exceed ``FACTOR_BUDGET`` elements, the structure accumulates
groups of calls (``Structure.factor_chunks``: kron, diag) and the model input is a float tensor on
which every recorded output depends, the batch is streamed (``Capture.stream``, ``capture.Streamed``):
one backward per factor w.r.t. the input, each output's gradient taken by a tensor hook as it
arrives and accumulated once ``STREAM_BUDGET`` elements are held, so the output gradients alive at
once stay below that. On CUDA (``OUTPUT_FREE_DEVICES``), once a batch of a fit was streamed, the
later ones are captured without keeping the module outputs (``Capture(stream=True)``: hooks
registered in the forward), so what stays alive is the forward graph alone, as in any backward
(conv outputs that only feed an addition are not kept by autograd: 75 MB for WRN-16-4 at batch 32).
Same work, plus the input's gradient through the first layer; on the CPU the ``K`` backward passes
ran one by one anyway.

When a batch is streamed (``stream_factors``, the one rule the memory plan uses too,
``plan_terms.backend_batch_bytes``): on the CPU, or without a memory budget
(``Laplace(memory_budget=None)``), when the ``K`` factors' gradients exceed ``FACTOR_BUDGET``
elements, decided per batch, as streaming costs no time there. On ``BUDGET_DEVICES`` (CUDA) streaming
costs time (the ``K`` backward passes run one after the other instead of as one batched backward:
WRN-16-4 KFAC fit 1.31 s -> 2.31 s on an H200), so with a budget a fit streams only when holding all
``K`` factors' gradients would push its planned fit peak above ``memory_budget`` times the
available memory; ``plan.fit_plan`` decides once per fit on its first batch (``Laplace.factor_streaming``)
and the backend follows it.
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.backends.base import Backend, register
from laplace_lab.laplace.capture import Capture, Streamed, has_inplace_modules
from laplace_lab.laplace.output_factors import output_factors

FACTOR_BUDGET = 2**24  # output-gradient elements of a batch (64 MiB in float32) above which it is streamed
STREAM_BUDGET = 2**22  # output-gradient elements held while streaming (16 MiB in float32)
# devices on which later streamed batches keep no module outputs: on the CPU that lowered the live
# memory of a WRN-16-4 batch but raised the peak RSS (glibc kept the freed heap: 0.70 vs 0.55 GiB
# above the start, benchmarks/fit_memory.py), so there the outputs are kept
OUTPUT_FREE_DEVICES = ("cuda",)
# devices on which streaming costs time: there a fit streams only when the memory budget needs it
BUDGET_DEVICES = ("cuda",)


def stream_factors(n_grads: int, device_type: str | None = None, held_fit: float | None = None,
                   limit: float | None = None) -> bool:
    """Whether the capture backend streams a fit batch whose ``K`` output factors' gradients of the
    recorded modules are ``n_grads`` elements (``K N`` times their output elements per input).

    ``device_type`` in ``BUDGET_DEVICES`` with a ``limit`` (bytes: ``memory_budget`` times the
    available memory) and ``held_fit`` (bytes: the planned fit peak with all those gradients held):
    stream exactly when ``held_fit > limit``. Otherwise (the CPU, ``memory_budget=None``, no plan):
    the constant rule, ``n_grads > FACTOR_BUDGET``. Whether a batch can be streamed at all (the
    structure's ``factor_chunks``, a float input every recorded output depends on) is the caller's.
    """
    if device_type in BUDGET_DEVICES and limit is not None and held_fit is not None:
        return held_fit > limit
    return n_grads > FACTOR_BUDGET


@register
class CaptureBackend(Backend):
    name = "capture"

    def __init__(self, la):
        super().__init__(la)
        self.modules = [e.module for e in la.entries]
        self.last_layer = la.subset_of_weights == "last_layer"
        self.protect = not self.last_layer and has_inplace_modules(la.model)
        self.streaming = False  # a batch of this fit was streamed: later ones keep no outputs

    def _forward(self, X, stream: bool):
        """``(capture, output)`` of one forward; ``stream``: ``Capture(stream=True)`` (no outputs kept)."""
        la, modules, last_layer = self.la, self.modules, self.last_layer
        if stream:
            with Capture(modules, protect_inplace=False, stream=True) as cap, torch.enable_grad():
                return cap, la.model(X)
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
        return cap, out

    def _stream(self, n_factors: int, cap) -> bool:
        """``Laplace.factor_streaming`` where the plan decided it for this fit (``BUDGET_DEVICES`` with a
        ``memory_budget``), else ``stream_factors``' constant rule on this batch's gradients."""
        decided = self.la.factor_streaming
        if decided is not None:
            return decided
        return stream_factors(n_factors * sum(c.out_shape.numel() for r in cap.records for c in r.calls))

    def batch(self, X, y):
        la = self.la
        source = None  # the input as a leaf requiring grad: the streamed backward's target
        if not self.last_layer and la.structure.factor_chunks and isinstance(X, torch.Tensor) and X.is_floating_point():
            X = source = X.detach().requires_grad_(True)
        cap, out = self._forward(X, stream=self.streaming and source is not None
                                 and source.device.type in OUTPUT_FREE_DEVICES)
        if cap.stream_mode and not cap.can_stream(out, source):  # the outputs are gone: redo, keeping them
            self.streaming = False
            cap, out = self._forward(X, stream=False)
        la.check_targets(out, y)
        f, yy = la.lik.prepare(out, y)
        V = output_factors(la.lik, la.curvature, f, yy, la.n_mc_samples, la.generator)
        V = V.reshape(V.shape[0], *out.shape)
        if source is not None and (cap.stream_mode or (self._stream(V.shape[0], cap) and cap.can_stream(out, source))):
            self.streaming = True
            return f.detach(), yy, Streamed(lambda accumulate: cap.stream(out, V, source, accumulate, STREAM_BUDGET))
        cap.backward(out, V)
        return f.detach(), yy, cap.records
