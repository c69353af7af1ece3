"""Functional (output-space) covariance ``J Sigma J^T`` of the linearised network, per input.

Hand-written on top of ``capture.Capture`` (one forward with hooks, one batched backward of the
``C`` unit output directions): laplace-torch forms the per-input Jacobian over all weights
(``[N, C, P]``) and curvlinops has no per-input functional-variance operator, so neither does this
without materialising Jacobians.

For a Linear / Conv2d layer with expanded input rows ``a`` ``[N, S, D_in]`` and output-gradient
rows ``g`` ``[C, N, S, D_out]`` (``g[k]`` = d f_k / d layer output), the weight Jacobian of output
``k`` is ``J_k = sum_s g_ks a_s^T`` (``[D_out, D_in]``, ``weight.flatten()`` order) and the bias
Jacobian ``sum_s g_ks``. Per posterior structure:

- ``kron``: a weight block has covariance ``(Q_G (x) Q_A) diag(1 / (c lamG_i lamA_j + delta))
  (Q_G (x) Q_A)^T``; rotate ``a -> a Q_A`` and ``g -> g Q_G`` and weight by the inverse
  eigenvalues. With one row per input (``S = 1``, a plain Linear) ``J_k`` is rank one and
  ``J_k Sigma J_l^T = sum_i g_ki g_li (inv @ a^2)_i`` (no Jacobian is formed; this is the
  ``phi^T Sigma phi`` of the last layer, never ``phi (x) I``); with ``S > 1`` (Conv2d, the
  "expand" convention: a sum over spatial positions) the layer's rotated Jacobian
  ``[n, C, D_out D_in]`` is formed for a bounded sub-chunk of inputs only.
- ``diag``: the same with ``Q = I`` and the inverse precisions as weights.
- any other parameter tensor (diagonal block, e.g. BatchNorm): per-sample gradients of that
  module only (``modules.per_sample_grads``), weighted elementwise.
- ``full``: the Jacobian over the subset per sub-chunk (Sigma is dense ``[P, P]`` anyway);
  a single Linear with one row per input (last layer) uses the Kronecker form
  ``g (a~^T Sigma~ a~) g^T`` with ``a~ = [a, 1]`` instead of ``J``.

Memory: per call ``O(chunk * (activations + C * layer outputs))`` plus per-layer blocks of at most
``budget`` elements. Differentiable w.r.t. the input when ``differentiable=True`` (module inputs
stay attached and the output-gradients are built with ``create_graph``), and always w.r.t. the
prior precision / noise (the posterior view keeps their graph).
"""

from __future__ import annotations

import torch
from torch import nn

from laplace_lab.laplace.capture import Call, Capture
from laplace_lab.laplace.modules import conv_rows, is_kfac_module, per_sample_grads

DEFAULT_BUDGET = 2**24  # elements per per-layer Jacobian block (64 MiB in float32)


# ---------------------------------------------------------------------------------------- capture
class _GraphCapture(Capture):
    """``Capture`` that keeps module inputs attached to the graph and back-propagates with
    ``create_graph=True`` so the functional variance is differentiable w.r.t. the input."""

    def _hook(self, record, index=None):
        def hook(module, args, kwargs, output):
            record.calls.append(Call(tuple(args), kwargs, output))
            if self.protect_inplace and output.requires_grad:
                return output + 0
            return None

        return hook

    def backward(self, f, V):
        calls = [c for r in self.records for c in r.calls]
        rest = [c for c in calls if c.output is not f]
        for c in calls:
            if c.output is f:
                c.grad = V
        if not rest:
            return
        grads = torch.autograd.grad(f, [c.output for c in rest], grad_outputs=V, is_grads_batched=True,
                                    allow_unused=True, create_graph=True)
        for c, g in zip(rest, grads):
            c.grad = torch.zeros((V.shape[0], *c.output.shape), dtype=V.dtype, device=V.device) if g is None else g


def capture_output_grads(la, x: torch.Tensor, differentiable: bool = False):
    """Forward ``x`` (``[B, ...]``) with hooks on the subset's modules and back-propagate the ``C``
    unit output directions. Returns ``(f [B, C], records, V)``; ``records[i].calls[j].grad`` is
    ``[C, B, *module output]`` (``V`` itself, ``[C, B, C]``, for a module whose output is ``f``)."""
    modules = [e.module for e in la.entries]
    last_layer = la.subset_of_weights == "last_layer"
    cap = None
    if last_layer and not differentiable:
        with Capture(modules, protect_inplace=False) as cap, torch.no_grad():
            out = la.model(x)
        calls = cap.records[0].calls
        if not (len(calls) == 1 and calls[0].output is out):
            cap = None  # something follows the last layer: redo with a graph
    if cap is None:
        cls = _GraphCapture if differentiable else Capture
        xg = x
        if not differentiable and isinstance(x, torch.Tensor) and x.is_floating_point():
            xg = x.detach().requires_grad_(True)  # a graph even if no parameter requires grad
        with cls(modules, protect_inplace=True) as cap, torch.enable_grad():
            out = la.model(xg)
    B = out.shape[0]
    f = out.reshape(B, -1)
    C = f.shape[1]
    V = torch.eye(C, dtype=f.dtype, device=f.device)[:, None, :].expand(C, B, C).contiguous()
    cap.backward(out, V.reshape(C, *out.shape))
    if not differentiable:
        f = f.detach()
    return f, cap.records, V


# ---------------------------------------------------------------------------------------- helpers
def _gram(J: torch.Tensor, w, diag: bool) -> torch.Tensor:
    """``J`` ``[N, K, p]``, weights ``w`` (broadcast to ``[N, K, p]``) -> ``[N, K, K]`` (or ``[N, K]``)."""
    if diag:
        return (J.square() * w).sum(-1)
    return (J * w) @ J.transpose(-1, -2)


def _sub_chunks(N: int, per_item: int, budget: int) -> list[slice]:
    step = max(1, budget // max(1, per_item))
    return [slice(i, min(N, i + step)) for i in range(0, N, step)]


def _identity_grads(calls, V) -> bool:
    return len(calls) == 1 and calls[0].grad is V


def _kfac_rows(m: nn.Module, calls: list[Call], QG, QA):
    """Rotated rows of all calls of one Linear/Conv2d: ``a Q_A`` ``[N, S, D_in]`` and
    ``Q_G^T g`` ``[K, N, D_out, S]`` (``Q = None``: identity); calls are concatenated along ``S``."""
    As, Gs = [], []
    for c in calls:
        a, g = c.args[0], c.grad
        K, N = g.shape[:2]
        if isinstance(m, nn.Conv2d):
            a = conv_rows(m, a).view(N, -1, m.weight[0].numel())  # [N, S, C_in kh kw]
            g = g.reshape(K, N, g.shape[2], -1)  # native layout [K, N, D_out, S]
            if QG is not None:
                g = torch.einsum("oi,knos->knis", QG, g)
        else:
            a = a.reshape(N, -1, a.shape[-1])
            g = g.reshape(K, N, -1, g.shape[-1])
            if QG is not None:
                g = g @ QG
            g = g.transpose(2, 3)
        As.append(a @ QA if QA is not None else a)
        Gs.append(g)
    if len(calls) == 1:
        return As[0], Gs[0]
    return torch.cat(As, 1), torch.cat(Gs, 3)


# ------------------------------------------------------------------------------- posterior views
class LayerwiseView:
    """kron / diag: per module, per parameter tensor ``(kind, QG, QA, weights)``:
    ``kind`` "w" (KFAC weight, weights ``[D_out, D_in]``), "b" (KFAC bias, ``[D_out]``) or
    "d" (elementwise, ``[numel]``); ``Q`` = None means the identity. ``rows``: one item per parameter
    tensor in subset order, a spec tuple from the structure or a flat variance tensor (its
    ``posterior_view`` supplies them)."""

    def __init__(self, la, rows):
        rows = iter(rows)
        self.specs = []
        for e in la.entries:
            kfac = is_kfac_module(e.module)
            spec = {}
            for n in e.names:
                row = next(rows)
                spec[n] = row if isinstance(row, tuple) else self._plain(kfac, n, getattr(e.module, n), row)
            self.specs.append(spec)

    @staticmethod
    def _plain(kfac, name, p, var):
        if kfac and name == "weight":
            return ("w", None, None, var.reshape(p.shape[0], -1))
        if kfac and name == "bias":
            return ("b", None, None, var)
        return ("d", None, None, var)

    def __call__(self, la, records, V, diag: bool, budget: int) -> torch.Tensor:
        out = 0
        for e, r, spec in zip(la.entries, records, self.specs):
            if not r.calls:
                continue
            if is_kfac_module(e.module):
                out = out + self._kfac(e.module, r.calls, spec, V, diag, budget)
            else:
                psg = per_sample_grads(e.module, e.names, r.calls)
                for n in e.names:
                    J = psg[n].flatten(2).transpose(0, 1)  # [N, K, p]
                    out = out + _gram(J, spec[n][3], diag)
        return out

    @staticmethod
    def _kfac(m, calls, spec, V, diag, budget):
        QG = next(s[1] for s in spec.values())  # weight and bias share Q_G (None for diag)
        out = 0
        if isinstance(m, nn.Linear) and _identity_grads(calls, V) and calls[0].args[0].ndim == 2:
            # the layer's output is the network output: g = e_k, rotated g = rows of Q_G
            a = calls[0].args[0]
            Gt = QG if QG is not None else torch.eye(V.shape[0], dtype=V.dtype, device=V.device)  # [K, D_out]
            for kind, _, QA, w in spec.values():
                if kind == "w":
                    at = a @ QA if QA is not None else a
                    ww = at.square() @ w.T  # [N, D_out]
                else:
                    ww = w.expand(a.shape[0], -1)
                if diag:
                    out = out + ww @ Gt.square().T
                else:
                    out = out + torch.einsum("ki,ni,li->nkl", Gt, ww, Gt)
            return out
        QA = next((sp[2] for sp in spec.values() if sp[0] == "w"), None)
        at, Gt = _kfac_rows(m, calls, QG, QA)  # [N, S, D_in], [K, N, D_out, S]
        K, N, D_out, S = Gt.shape
        for kind, _, _, w in spec.values():
            if kind == "b":
                out = out + _gram(Gt.sum(3).transpose(0, 1), w, diag)
            elif S == 1:
                J = Gt[..., 0].transpose(0, 1)  # [N, K, D_out]
                out = out + _gram(J, (at[:, 0].square() @ w.T)[:, None, :], diag)
            else:
                Gn = Gt.permute(1, 0, 2, 3)  # [N, K, D_out, S]
                parts = []
                for sl in _sub_chunks(N, K * w.numel(), budget):
                    Gs = Gn[sl].reshape(-1, K * D_out, S)
                    J = torch.bmm(Gs, at[sl]).reshape(-1, K, w.numel())  # rotated Jacobian block
                    parts.append(_gram(J, w.reshape(-1), diag))
                out = out + torch.cat(parts)
        return out


def _jacobian_rows(entries, records, sl) -> torch.Tensor:
    """``[n, K, P]`` per-sample rows ``V_k^T J_n`` of inputs ``sl`` from the captured calls."""
    cols = []
    for e, r in zip(entries, records):
        if not r.calls:
            K = next(c.grad for rr in records for c in rr.calls).shape[0]
            cols += [p.new_zeros(sl.stop - sl.start, K, p.numel()) for p in e.params]
            continue
        sub = [Call(tuple(x[sl] if isinstance(x, torch.Tensor) else x for x in c.args), c.kwargs,
                    c.output, c.grad[:, sl]) for c in r.calls]
        psg = per_sample_grads(e.module, e.names, sub)
        cols += [psg[n].flatten(2).transpose(0, 1) for n in e.names]
    return torch.cat(cols, -1)


class JacobianView:
    """Any structure: per-sample Jacobian rows ``[n, K, P]`` (in budget-sized input chunks) and the
    structure's own ``functional_variance``. The default ``Structure.posterior_view``."""

    def __init__(self, la):
        self.structure, self.c, self.prior = la.structure, la.H_factor, la.structure_prior

    def __call__(self, la, records, V, diag: bool, budget: int) -> torch.Tensor:
        K, N = next(c.grad for r in records for c in r.calls).shape[:2]
        parts = []
        for sl in _sub_chunks(N, K * self.structure.n_params, budget):
            fv = self.structure.functional_variance(_jacobian_rows(la.entries, records, sl), self.c, self.prior)
            parts.append(fv.diagonal(dim1=1, dim2=2) if diag else fv)
        return torch.cat(parts)


class FullView:
    """full: dense ``Sigma`` ``[P, P]`` (one Cholesky inverse per predictive call)."""

    def __init__(self, la):
        self.Sigma = la.structure.covariance(la.H_factor, la.structure_prior)
        self.sizes = la.structure.sizes

    def __call__(self, la, records, V, diag: bool, budget: int) -> torch.Tensor:
        entries = la.entries
        if len(entries) == 1 and isinstance(entries[0].module, nn.Linear) and len(records[0].calls) == 1 \
                and records[0].calls[0].args[0].ndim == 2:
            return self._linear(entries[0], records[0].calls[0], V, diag, budget)
        K, N = next(c.grad for r in records for c in r.calls).shape[:2]
        parts = []
        for sl in _sub_chunks(N, K * self.Sigma.shape[0], budget):
            J = _jacobian_rows(entries, records, sl)  # [n, K, P]
            JS = J @ self.Sigma
            parts.append((JS * J).sum(-1) if diag else JS @ J.transpose(-1, -2))
        return torch.cat(parts)

    def _linear(self, e, call, V, diag, budget):
        """One Linear, 2-d input: ``J_k = g_k (x) [a, 1]``, so
        ``J_k Sigma J_l^T = g_k^T U g_l`` with ``U_oo' = a~^T Sigma~[o, :, o', :] a~``."""
        m, a = e.module, call.args[0]
        D_out, D_in = m.out_features, m.in_features
        S = self.Sigma
        nw = D_out * D_in if "weight" in e.names else 0
        if "weight" in e.names and "bias" in e.names:
            St = S.new_zeros(D_out, D_in + 1, D_out, D_in + 1)
            St[:, :D_in, :, :D_in] = S[:nw, :nw].reshape(D_out, D_in, D_out, D_in)
            St[:, :D_in, :, D_in] = S[:nw, nw:].reshape(D_out, D_in, D_out)
            St[:, D_in, :, :D_in] = S[nw:, :nw].reshape(D_out, D_out, D_in)
            St[:, D_in, :, D_in] = S[nw:, nw:]
            a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
        elif "weight" in e.names:
            St = S.reshape(D_out, D_in, D_out, D_in)
        else:
            St, a = S.reshape(D_out, 1, D_out, 1), a.new_ones(a.shape[0], 1)
        Di = a.shape[1]
        Sp = St.permute(1, 0, 2, 3).reshape(Di, -1)  # [Di, D_out * D_out * Di]
        Us = []
        for sl in _sub_chunks(a.shape[0], D_out * D_out * Di, budget):
            Y = (a[sl] @ Sp).reshape(-1, D_out, D_out, Di)
            Us.append(torch.einsum("nopj,nj->nop", Y, a[sl]))
        U = torch.cat(Us)  # [N, D_out, D_out]
        if _identity_grads([call], V):
            return U.diagonal(dim1=1, dim2=2) if diag else U
        g = call.grad.transpose(0, 1)  # [N, K, D_out]
        GU = g @ U
        return (GU * g).sum(-1) if diag else GU @ g.transpose(1, 2)


def posterior_view(la):
    """Per-call precomputation (inverse eigenvalues / variances / dense covariance): the structure's
    ``posterior_view`` (``structures.base``)."""
    return la.structure.posterior_view(la)


def functional_variance(la, x: torch.Tensor, diag: bool = False, differentiable: bool = False,
                        view=None, budget: int = DEFAULT_BUDGET):
    """One chunk: ``(f [B, C], f_var)`` with ``f_var`` ``[B, C, C]`` (``[B, C]`` if ``diag``)."""
    view = view if view is not None else posterior_view(la)
    f, records, V = capture_output_grads(la, x, differentiable)
    return f, view(la, records, V, diag, budget)


__all__ = ["capture_output_grads", "functional_variance", "posterior_view", "LayerwiseView", "FullView",
           "JacobianView"]
