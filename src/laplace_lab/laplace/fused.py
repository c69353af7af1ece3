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

Cost (LeNet-5, batch 128, CPU): the only extra work for ``ef`` is the factor kernels
(``modules.kfac_factors``: conv ``A`` by ``conv_factors.conv_A_rows``, ``G``, Linear ``a^T a``,
``g^T g``). Batches are not accumulated one by one: their layer inputs and output gradients wait
until ``chunk_size`` (default 512) samples have been back-propagated, then the kernels run once on
the concatenation (~25% less time per sample than batch by batch: fewer dispatches, larger GEMMs;
the EF rescaling ``1 / nll_scale`` is folded into the concatenating copy, into buffers reused
from chunk to chunk). Measured in ``benchmarks/marglik_overhead.py``.

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
    fused.end()                        # accumulates what still waits, finalises

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

from laplace_lab.laplace.capture import Call, Capture, Record, has_inplace_modules
from laplace_lab.laplace.modules import is_kfac_module
from laplace_lab.laplace.output_factors import output_factors
from laplace_lab.laplace.precision import no_tf32

FUSED_CURVATURE_TYPES = ("ef", "mc_fisher")
def fused_structures() -> tuple[str, ...]:
    """Registered structures with ``supports_fused`` (kron, diag)."""
    from laplace_lab.laplace.structures import STRUCTURES

    return tuple(n for n, cls in STRUCTURES.items() if cls.supports_fused)
FUSED_SUBSETS = ("all",)


def _nbytes(c: Call) -> int:
    n = sum(a.numel() * a.element_size() for a in c.args if isinstance(a, torch.Tensor))
    return n + sum(g.numel() * g.element_size() for g in (c.grads or []))


class _Buffers:
    """Concatenation buffers kept from chunk to chunk: writing into memory the process already
    touched (CPU tensors come from malloc; fresh large blocks page-fault on first write) made the
    concatenation ~4x cheaper than ``torch.cat`` into a new tensor on LeNet-5."""

    def __init__(self):
        self._store: dict = {}

    def get(self, key, like: torch.Tensor, n: int) -> torch.Tensor:
        buf = self._store.get(key)
        if buf is None or buf.shape[0] < n or buf.shape[1:] != like.shape[1:] or buf.dtype != like.dtype \
                or buf.device != like.device:
            buf = like.new_empty((n, *like.shape[1:]))
            self._store[key] = buf
        return buf[:n]


def _cat_scaled(ts: list[torch.Tensor], scales: list[float], out: torch.Tensor | None = None) -> torch.Tensor:
    """``cat([t * s])`` along dim 0 in one copy (into ``out`` if given; no copy for one unscaled tensor)."""
    if len(ts) == 1 and scales[0] == 1.0:
        return ts[0]
    if out is None:
        out = ts[0].new_empty((sum(t.shape[0] for t in ts), *ts[0].shape[1:]))
    i = 0
    for t, sc in zip(ts, scales):
        if sc == 1.0:
            out[i:i + t.shape[0]].copy_(t)
        else:
            torch.mul(t, sc, out=out[i:i + t.shape[0]])
        i += t.shape[0]
    return out


def _scaled_call(c: Call, scale: float) -> Call:
    out = Call(c.args, c.kwargs, None)
    out.grads = [g * scale for g in c.grads] if scale != 1.0 else c.grads
    return out


def _merge_calls(calls_per_batch: list[list[Call]], scales: list[float], buffers: _Buffers | None = None,
                 key=None) -> list[Call] | None:
    """One Call per call index with the batches' inputs and (rescaled) output gradients
    concatenated along the sample dimension; ``None`` if the batches do not line up."""
    n_calls = len(calls_per_batch[0])
    if any(len(cs) != n_calls for cs in calls_per_batch):
        return None
    out = []
    for k in range(n_calls):
        cs = [cb[k] for cb in calls_per_batch]
        a0 = [c.args[0] if c.args else None for c in cs]
        gs = [c.grads for c in cs]
        if any(not isinstance(a, torch.Tensor) or a.dim() == 0 or a.shape[1:] != a0[0].shape[1:] for a in a0):
            return None
        if any(len(g) != len(gs[0]) or any(gi.shape[1:] != g0.shape[1:] for gi, g0 in zip(g, gs[0])) for g in gs):
            return None
        n, pooled = sum(a.shape[0] for a in a0), buffers is not None and len(cs) > 1
        call = Call((_cat_scaled(a0, [1.0] * len(a0), buffers.get((key, k, "a"), a0[0], n) if pooled else None),),
                    {}, None)
        call.grads = [_cat_scaled([g[i] for g in gs], scales, buffers.get((key, k, i), gs[0][i], n) if pooled else None)
                      for i in range(len(gs[0]))]
        out.append(call)
    return out


class _BatchRecorder:
    def __init__(self, fused: FusedCurvature, cap: Capture, y: torch.Tensor, nll_scale: float):
        self._fused, self._cap, self._y, self.nll_scale = fused, cap, y, float(nll_scale)
        self.f = None
        self.n = 0  # data points of the batch

    def output(self, f: torch.Tensor) -> None:
        """Register the network output of this batch (once). For ``mc_fisher`` this runs the
        sampled-label backward to the recorded layer outputs (graph retained)."""
        if self.f is not None:
            raise RuntimeError("rec.output(f) was already called for this batch")
        la = self._fused.la
        self.f = f
        ff, yy = la.lik.prepare(f.detach(), self._y.to(f.device))
        la.add_batch(ff, yy)  # loss and counts; the curvature follows in FusedCurvature._accumulate_ready
        self.n = ff.shape[0]
        if la.curvature == "mc_fisher":
            if self._cap.modified_inplace():
                raise RuntimeError(
                    "a recorded layer output was modified in place after its module returned (e.g. a "
                    "functional relu_ or +=); FusedCurvature with mc_fisher cannot redo the forward: "
                    "use nn modules with inplace=True (detected and protected) or out-of-place ops")
            V = output_factors(la.lik, "mc_fisher", ff, yy, la.n_mc_samples, la.generator)
            self._cap.backward(f, V.reshape(V.shape[0], *f.shape), retain_graph=True)


class FusedCurvature:
    """Accumulates ``la``'s curvature (EF or MC-Fisher; kron or diag; all weights) from training
    steps. ``la``: a constructed, not yet fitted ``Laplace``. ``chunk_size``: samples whose factors
    are computed together (``1``: batch by batch); ``chunk_bytes``: also accumulate once the
    waiting layer inputs and gradients take this much memory. See the module docstring."""

    def __init__(self, la, chunk_size: int = 512, chunk_bytes: int = 2**26):
        if la.curvature not in FUSED_CURVATURE_TYPES:
            raise ValueError(f"FusedCurvature: curvature must be one of {FUSED_CURVATURE_TYPES}; got {la.curvature!r}")
        if not la.structure.supports_fused:
            raise ValueError(f"FusedCurvature: hessian_structure must be one of {fused_structures()}; "
                             f"got {la.hessian_structure!r}")
        if la.subset_of_weights not in FUSED_SUBSETS:
            raise ValueError(f"FusedCurvature: subset_of_weights must be one of {FUSED_SUBSETS}; "
                             f"got {la.subset_of_weights!r}")
        self.la = la
        self._modules = [e.module for e in la.entries]
        self._pending: list[tuple[Capture, _BatchRecorder]] = []
        # backpropagated batches waiting to be accumulated together: (records, grad scale, bytes)
        self._ready: list[tuple[list[Record], float, int]] = []
        self._ready_n = 0
        self.chunk_size, self.chunk_bytes = int(chunk_size), int(chunk_bytes)
        self._buffers = _Buffers()
        self._active = False

    def begin(self) -> None:
        """Reset the accumulators (curvature, loss, n_data). Leaves the model's train/eval mode alone."""
        la = self.la
        la.reset_accumulators()
        self._pending.clear()
        self._ready.clear()
        self._ready_n = 0
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

    def _ready_for(self, cap: Capture) -> bool:
        return all(c.grads is not None for r in cap.records for c in r.calls if c.output.requires_grad)

    def flush(self, strict: bool = True) -> None:
        """Take the recorded batches whose backward has run (for ``ef``, the training backward:
        ``strict`` raises if it has not, else they stay pending). Their factors are accumulated
        into ``la``'s structure once ``chunk_size`` samples (or ``chunk_bytes`` of layer inputs and
        output gradients) are waiting, and at ``end()``: the kernels run on concatenated batches
        (fewer, larger GEMMs, one dispatch per layer instead of one per batch; ~25% less time per
        sample on LeNet-5 at 512 vs 128), and the EF rescaling of the gradients is done by the
        concatenating copy."""
        keep = []
        for cap, rec in self._pending:
            if not self._ready_for(cap):
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
            scale = 1.0 / rec.nll_scale if self.la.curvature == "ef" else 1.0
            # The kernels need the inputs and gradients only: release the layer outputs (and the
            # graph behind them) now rather than when the chunk is accumulated.
            for r in cap.records:
                for c in r.calls:
                    c.output = None
            nbytes = sum(_nbytes(c) for r in cap.records for c in r.calls)
            self._ready.append((cap.records, scale, nbytes))
            self._ready_n += rec.n
        self._pending = keep
        if self._ready_n >= self.chunk_size or sum(b for _, _, b in self._ready) >= self.chunk_bytes:
            self._accumulate_ready()

    def _accumulate_ready(self) -> None:
        """Accumulate the waiting batches: Linear / Conv2d calls concatenated over batches (sums over
        samples); any other module, or calls whose shapes differ between batches, batch by batch."""
        ready, self._ready, self._ready_n = self._ready, [], 0
        if not ready:
            return
        scales = [sc for _, sc, _ in ready]
        merged, rest = [], []
        for j, m in enumerate(self._modules):
            calls = (_merge_calls([recs[j].calls for recs, _, _ in ready], scales, self._buffers, j)
                     if is_kfac_module(m) else None)
            if calls is None:
                rest.append(j)
            merged.append(Record(m, calls or []))
        with torch.no_grad(), no_tf32(self.la.device):
            if len(rest) < len(self._modules):
                self.la.structure.accumulate(merged)
            for recs, sc, _ in ready if rest else ():
                part = [Record(m) for m in self._modules]
                for j in rest:
                    part[j].calls = [_scaled_call(c, sc) for c in recs[j].calls]
                self.la.structure.accumulate(part)
        for recs, _, _ in ready:
            for r in recs:
                r.calls.clear()

    def end(self) -> None:
        """Flush, set ``la.mean`` to the current weights, finalise (KFAC eigendecompositions)."""
        self.flush(strict=True)
        self._accumulate_ready()
        self._buffers = _Buffers()  # free the concatenation buffers
        la = self.la
        la.mean = torch.cat([p.detach().reshape(-1) for p in la.params])
        la.fit_end()
        self._active = False
