"""Fused curvature: accumulate a Laplace's curvature from the ordinary training steps of an epoch.

Hand-written on the engine's own ``Capture`` hooks (no library does this). Instead of an extra
pass over the data (``Laplace.fit``), the curvature is collected while the model trains:

- ``ef`` (empirical Fisher): zero extra passes. Tensor hooks on the recorded layer outputs see
  ``dL/dz`` of the training loss during its ordinary backward; with ``nll_scale = dL/d(summed
  NLL)`` (e.g. ``1 / B`` for a batch-mean cross-entropy) ``dNLL_n/dz = (dL/dz) / nll_scale`` is the
  per-sample gradient the EF needs (the prior term of the loss does not flow through layer outputs).
- ``mc_fisher``: one extra backward per batch, of sampled-label NLL gradients from the output to
  the layer outputs (``retain_graph=True``, so the training backward still runs); no extra forward.
  Labels are drawn with ``la.generator`` exactly as ``Laplace.fit`` draws them, batch by batch.

Supported: ``curvature`` in ``("ef", "mc_fisher")``, ``hessian_structure`` in ``("kron", "diag")``,
``subset_of_weights == "all"``. The loss ``la.loss`` (summed NLL, unit noise for regression) and
``la.n_data`` are accumulated from the same batches; ``end()`` sets ``la.mean`` to the weights at
that moment and finalises the structure, after which ``la.log_marginal_likelihood()`` is ready.

Usage (a training step)::

    fused = FusedCurvature(la); fused.begin()
    for x, y in loader:
        with fused.batch(y, nll_scale=1 / len(y)) as rec:
            f = model(x)
            rec.output(f)
        loss = F.cross_entropy(f, y) + prior_term; loss.backward(); opt.step()
        fused.flush()                  # optional: also done lazily at the next batch / at end()
    fused.end()

Approximation (documented for the lead's measurement): with a real optimiser the weights change
after every step, so the fused curvature sums per-batch terms evaluated at the weights of
*that* step (it mixes the weights of the whole epoch), and ``la.loss`` likewise; only with fixed
weights (``lr = 0``) is it identical to ``Laplace.fit`` over the same batches (tested to 1e-10 in
float64). Also: the model stays in training mode, so dropout / batch-norm statistics are those of
training (``Laplace.fit`` uses eval mode), and with train-mode BatchNorm samples are coupled, so
the "per-sample" EF gradients are those of the coupled batch.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from laplace_lab.laplace.capture import Capture, has_inplace_modules
from laplace_lab.laplace.curvature import output_factors

FUSED_CURVATURES = ("ef", "mc_fisher")
FUSED_STRUCTURES = ("kron", "diag")
FUSED_SUBSETS = ("all",)


class _BatchRecorder:
    def __init__(self, fused: FusedCurvature, cap: Capture, y: torch.Tensor, nll_scale: float):
        self._fused, self._cap, self._y, self.nll_scale = fused, cap, y, float(nll_scale)
        self.f = None

    def output(self, f: torch.Tensor) -> None:
        """Register the network output of this batch (once). For ``mc_fisher`` this runs the
        sampled-label backward to the recorded layer outputs (graph retained)."""
        if self.f is not None:
            raise RuntimeError("rec.output(f) was already called for this batch")
        la = self._fused.la
        self.f = f
        ff, yy = la._lik.prepare(f.detach(), self._y.to(f.device))
        with torch.no_grad():
            la.loss = la.loss + la._lik.nll(ff, yy).to(la._dtype)
        la.n_data += ff.shape[0]
        la.n_outputs = ff.shape[1]
        if la.curvature == "mc_fisher":
            if self._cap.modified_inplace():
                raise RuntimeError(
                    "a recorded layer output was modified in place after its module returned (e.g. a "
                    "functional relu_ or +=); FusedCurvature with mc_fisher cannot redo the forward: "
                    "use nn modules with inplace=True (detected and protected) or out-of-place ops")
            V = output_factors(la._lik, "mc_fisher", ff, yy, la.n_mc_samples, la.generator)
            self._cap.backward(f, V.reshape(V.shape[0], *f.shape), retain_graph=True)


class FusedCurvature:
    """Accumulates ``la``'s curvature (EF or MC-Fisher; kron or diag; all weights) from training
    steps. ``la``: a constructed, not yet fitted ``Laplace``. See the module docstring."""

    def __init__(self, la):
        if la.curvature not in FUSED_CURVATURES:
            raise ValueError(f"FusedCurvature: curvature must be one of {FUSED_CURVATURES}; got {la.curvature!r}")
        if la.hessian_structure not in FUSED_STRUCTURES:
            raise ValueError(f"FusedCurvature: hessian_structure must be one of {FUSED_STRUCTURES}; "
                             f"got {la.hessian_structure!r}")
        if la.subset_of_weights not in FUSED_SUBSETS:
            raise ValueError(f"FusedCurvature: subset_of_weights must be one of {FUSED_SUBSETS}; "
                             f"got {la.subset_of_weights!r}")
        self.la = la
        self._modules = [e.module for e in la.entries]
        self._pending: list[tuple[Capture, _BatchRecorder]] = []
        self._active = False

    def begin(self) -> None:
        """Reset the accumulators (curvature, loss, n_data). Leaves the model's train/eval mode alone."""
        la = self.la
        la._structure.reset()
        la.loss = torch.zeros((), device=la._device, dtype=la._dtype)
        la.n_data = 0
        la._fitted = False
        self._pending.clear()
        self._active = True

    @contextmanager
    def batch(self, y: torch.Tensor, nll_scale: float):
        """Record one training step's forward. ``nll_scale``: d(training loss) / d(summed NLL of
        the batch) (``1 / B`` for a batch-mean NLL; ``1 / (B T)`` with a temperature T)."""
        if not self._active:
            raise RuntimeError("FusedCurvature.begin() must be called before batch()")
        if not nll_scale > 0:
            raise ValueError(f"nll_scale must be > 0; got {nll_scale!r}")
        self.flush(strict=False)  # the previous batch, if its backward has run
        ef = self.la.curvature == "ef"
        protect = (not ef) and has_inplace_modules(self.la.model)
        cap = Capture(self._modules, protect_inplace=protect, grad_hooks=ef)
        rec = _BatchRecorder(self, cap, y, nll_scale)
        with cap, torch.enable_grad():
            yield rec
        if rec.f is None:
            raise RuntimeError("call rec.output(f) with the network output inside `with fused.batch(...)`")
        self._pending.append((cap, rec))

    def _ready(self, cap: Capture) -> bool:
        return all(c.grads is not None for r in cap.records for c in r.calls if c.output.requires_grad)

    def flush(self, strict: bool = True) -> None:
        """Add the recorded batches to ``la``'s structure. For ``ef`` the training backward must
        have run (``strict``: raise otherwise; else keep them pending)."""
        keep = []
        for cap, rec in self._pending:
            if not self._ready(cap):
                started = any(c.grads is not None for r in cap.records for c in r.calls)
                if not (strict and started):
                    if strict:
                        raise RuntimeError("FusedCurvature.flush(): the training loss of a recorded batch has "
                                           "not been back-propagated yet (call flush after loss.backward())")
                    keep.append((cap, rec))
                    continue
                for r in cap.records:  # outputs the loss does not depend on: zero gradient
                    for c in r.calls:
                        if c.grads is None:
                            c.grads = [torch.zeros_like(c.output).detach()]
            if self.la.curvature == "ef":
                for r in cap.records:
                    for c in r.calls:
                        if c.grads is not None:
                            c.grads = [g / rec.nll_scale for g in c.grads]
            with torch.no_grad():
                self.la._structure.accumulate(cap.records)
        self._pending = keep

    def end(self) -> None:
        """Flush, set ``la.mean`` to the current weights, finalise (KFAC eigendecompositions)."""
        self.flush(strict=True)
        la = self.la
        la.mean = torch.cat([p.detach().reshape(-1) for p in la.params])
        la.fit_end()
        self._active = False
