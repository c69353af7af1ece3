"""Per-module curvature kernels from captured inputs ``a`` and output gradients ``g``.

Hand-written: the closed forms for Linear and Conv2d (patches via ``F.unfold``) are a few
einsums, cheaper than a generic per-sample-gradient library for diag and KFAC, and never
form per-sample Jacobians over all weights. Any other module with parameters (BatchNorm,
LayerNorm, Embedding, Conv1d, grouped convs, ...) goes through ``generic_per_sample_grads``:
torch.func ``vmap`` over samples of a module-local ``vjp`` of ``functional_call`` (only that
module's own parameters, only that module's forward).

Conventions (shapes): ``g`` is ``[K, N, *out]``; "expand" view (curvlinops' default KFAC-expand):
a Linear on ``[N, *, d_in]`` or a Conv2d with ``S`` output positions is ``S`` rows per sample:
``rows_in`` ``[N, S, D_in]`` (Conv2d: ``D_in = C_in * kh * kw`` in weight-flattening order),
``rows_out`` ``[K, N, S, D_out]``. The weight gradient of sample ``n`` for factor ``k`` is
``sum_s rows_out[k, n, s] rows_in[n, s]^T`` (``[D_out, D_in]``, row-major = ``weight.flatten()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from laplace_lab.laplace.capture import Call


def is_kfac_module(m: nn.Module) -> bool:
    """Modules with the closed-form (Kronecker) treatment: Linear and plain Conv2d."""
    if type(m) is nn.Linear or isinstance(m, nn.Linear):
        return True
    return (
        isinstance(m, nn.Conv2d)
        and m.groups == 1
        and m.padding_mode == "zeros"
        and not isinstance(m.padding, str)
    )


def rows_in(m: nn.Module, a: torch.Tensor) -> torch.Tensor:
    """Module input -> ``[N, S, D_in]`` expanded rows."""
    if isinstance(m, nn.Conv2d):
        x = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
        return x.transpose(1, 2)  # [N, S, C_in*kh*kw]
    return a.reshape(a.shape[0], -1, a.shape[-1])


def rows_out(m: nn.Module, g: torch.Tensor) -> torch.Tensor:
    """Output gradients ``[K, N, *out]`` -> ``[K, N, S, D_out]``."""
    K, N = g.shape[:2]
    if isinstance(m, nn.Conv2d):
        return g.reshape(K, N, g.shape[2], -1).transpose(2, 3)
    return g.reshape(K, N, -1, g.shape[-1])


def _param_items(m: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    return {n: getattr(m, n) for n in names}


def kfac_per_sample_grads(m: nn.Module, names: list[str], call: Call, k_slice=slice(None)):
    """Per-sample gradients ``{name: [K, N, *param.shape]}`` for Linear / Conv2d."""
    a = rows_in(m, call.args[0])
    g = rows_out(m, call.grad[k_slice])
    out = {}
    if "weight" in names:
        w = torch.einsum("knso,nsi->knoi", g, a)
        out["weight"] = w.reshape(*w.shape[:2], *m.weight.shape)
    if "bias" in names:
        out["bias"] = g.sum(2)
    return out


def generic_per_sample_grads(m: nn.Module, names: list[str], call: Call, k_slice=slice(None)):
    """Per-sample gradients of any module's own parameters via vmap(vjp(functional_call))."""
    params = {n: p.detach() for n, p in _param_items(m, names).items()}
    g = call.grad[k_slice]  # [K, N, *out]
    tensor_pos = [i for i, x in enumerate(call.args) if isinstance(x, torch.Tensor)]
    batched = tuple(call.args[i] for i in tensor_pos)

    def one_sample(xs, gs):  # xs: sample inputs, gs: [K, *out_n]
        args = list(call.args)
        for i, x in zip(tensor_pos, xs):
            args[i] = x.unsqueeze(0)

        def fwd(p):
            return functional_call(m, p, tuple(args), call.kwargs)

        _, pull = vjp(fwd, params)
        return vmap(lambda v: pull(v.unsqueeze(0))[0])(gs)

    res = vmap(one_sample, in_dims=(0, 1))(batched, g)  # {name: [N, K, *shape]}
    return {n: v.transpose(0, 1) for n, v in res.items()}


def per_sample_grads(m, names, calls: list[Call], k_slice=slice(None)):
    """Sum over calls of per-sample gradients ``{name: [K, N, *shape]}``."""
    fn = kfac_per_sample_grads if is_kfac_module(m) else generic_per_sample_grads
    total = None
    for c in calls:
        r = fn(m, names, c, k_slice)
        total = r if total is None else {n: total[n] + r[n] for n in r}
    return total


def _k_chunks(K: int, N: int, numel: int, budget: int = 2**25):
    step = max(1, budget // max(1, N * numel))
    return [slice(i, min(K, i + step)) for i in range(0, K, step)]


def diag_sq(m: nn.Module, names: list[str], calls: list[Call]) -> dict[str, torch.Tensor]:
    """``{name: sum_{k,n} (per-sample grad)^2}`` with the shape of each parameter."""
    if is_kfac_module(m) and len(calls) == 1:
        c = calls[0]
        a = rows_in(m, c.args[0])
        if a.shape[1] == 1 and not isinstance(m, nn.Conv2d):  # no weight sharing: closed form
            g2 = rows_out(m, c.grad)[:, :, 0].square()  # [K, N, D_out]
            out = {}
            if "weight" in names:
                out["weight"] = torch.einsum("kno,ni->oi", g2, a[:, 0].square())
            if "bias" in names:
                out["bias"] = g2.sum((0, 1))
            return out
    K, N = calls[0].grad.shape[:2]
    numel = sum(getattr(m, n).numel() for n in names)
    out = {n: torch.zeros_like(getattr(m, n)) for n in names}
    for ks in _k_chunks(K, N, numel):
        psg = per_sample_grads(m, names, calls, ks)
        for n in names:
            out[n] += psg[n].square().sum((0, 1))
    return out


def kfac_factors(m: nn.Module, calls: list[Call]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Un-normalised KFAC-expand factors: ``(A_sum [D_in, D_in], G [D_out, D_out], rows)``.

    ``A_sum = sum_{n,s} a a^T``, ``G = sum_{k,n,s} g g^T``; the weight block is
    ``G (x) A_sum / rows_total`` where ``rows_total = sum_n S`` over the whole data set.
    Conv2d uses batched ``X X^T`` on the native ``[N, D, S]`` layouts (no transposed copies).
    """
    A = G = None
    rows = 0
    for c in calls:
        a, g = c.args[0], c.grad
        if isinstance(m, nn.Conv2d):
            x = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
            gm = g.reshape(-1, g.shape[2], g.shape[3] * g.shape[4])  # [K N, C_out, S]
            A_c = torch.bmm(x, x.transpose(1, 2)).sum(0)
            G_c = torch.bmm(gm, gm.transpose(1, 2)).sum(0)
            n_rows = x.shape[0] * x.shape[2]
        else:
            x = a.reshape(-1, a.shape[-1])
            gm = g.reshape(-1, g.shape[-1])
            A_c, G_c = x.T @ x, gm.T @ gm
            n_rows = x.shape[0]
        A = A_c if A is None else A + A_c
        G = G_c if G is None else G + G_c
        rows += n_rows
    return A, G, rows
