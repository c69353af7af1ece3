"""Per-module curvature kernels from captured inputs ``a`` and output gradients ``g``.

Hand-written: the closed forms for Linear and Conv2d are a few matmuls, cheaper than a generic
per-sample-gradient library for diag and KFAC (benchmarks/fit.py), and never form per-sample
Jacobians over all weights. Measured on LeNet-5 / CPU (profile of one fit): the Conv2d KFAC
factor ``A`` via ``F.unfold`` + batched ``X X^T`` was the top hot spot (im2col copies, ``bmm`` of
``[N, D, S]``); ``conv_A`` computes it exactly from a width-only unfold and ``kh`` banded products
(~5x faster). Conv2d diag uses chunked per-sample products (``_conv_psg_sq``). The output
gradients arrive per factor (``call.grads``, one tensor per backward), so ``G`` and the diag sums
are accumulated per factor without stacking ``[K, N, ...]``. Any other module with parameters (BatchNorm,
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


def flat_kn(g: torch.Tensor) -> torch.Tensor:
    """``[K, N, *rest]`` -> ``[K N, *rest]`` (rows in either (k, n) or (n, k) order: for sums over
    both), a view for the contiguous and the sample-major layouts that ``Capture`` produces."""
    if g.transpose(0, 1).is_contiguous():
        return g.transpose(0, 1).reshape(-1, *g.shape[2:])
    return g.reshape(-1, *g.shape[2:])


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


def _conv_psg_sq(m: nn.Conv2d, names: list[str], a: torch.Tensor, grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: sum_{k,n} (per-sample grad)^2}`` for a Conv2d: ``a`` [N, C_in, H, W], ``grads``
    ``K`` x [N, C_out, Ho, Wo].

    Per-sample weight gradients ``g_n [K C_out, S] @ x_n^T [S, D_in]`` as batched matmuls over
    chunks of samples (the chunk's ``[n, K C_out, S]`` and ``[n, K C_out, D_in]`` blocks stay in
    cache), squared and summed at once; never the ``[K, N, C_out, D_in]`` tensor of all of them.
    """
    K = len(grads)
    N, n_out = grads[0].shape[:2]
    out = {}
    if "weight" in names:
        x = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)  # [N, D, S]
        xt = x.transpose(1, 2)
        D = x.shape[1]
        step = max(1, 2**18 // max(1, K * n_out * max(D, x.shape[2])))
        acc = a.new_zeros(K * n_out, D)
        for i in range(0, N, step):
            gg = torch.stack([gk[i:i + step].flatten(2) for gk in grads], 1).flatten(1, 2)  # [n, K n_out, S]
            acc += torch.bmm(gg, xt[i:i + step]).square().sum(0)
        out["weight"] = acc.reshape(K, n_out, D).sum(0).reshape(m.weight.shape)
    if "bias" in names:
        out["bias"] = sum(gk.flatten(2).sum(2).square().sum(0) for gk in grads)
    return out


def diag_sq(m: nn.Module, names: list[str], calls: list[Call]) -> dict[str, torch.Tensor]:
    """``{name: sum_{k,n} (per-sample grad)^2}`` with the shape of each parameter."""
    if is_kfac_module(m) and len(calls) == 1:
        c = calls[0]
        if isinstance(m, nn.Conv2d):
            return _conv_psg_sq(m, names, c.args[0], c.grads)
        a = rows_in(m, c.args[0])
        if a.shape[1] == 1:  # Linear without weight sharing: closed form
            g2 = sum(gk.reshape(gk.shape[0], -1).square() for gk in c.grads)  # [N, D_out]
            out = {}
            if "weight" in names:
                out["weight"] = g2.T @ a[:, 0].square()
            if "bias" in names:
                out["bias"] = g2.sum(0)
            return out
    K, N = calls[0].grad.shape[:2]
    numel = sum(getattr(m, n).numel() for n in names)
    out = {n: torch.zeros_like(getattr(m, n)) for n in names}
    for ks in _k_chunks(K, N, numel):
        psg = per_sample_grads(m, names, calls, ks)
        for n in names:
            out[n] += psg[n].square().sum((0, 1))
    return out


def conv_A(m: nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(sum_{n,s} x_{ns} x_{ns}^T, N S)`` over the patches ``x_{ns}`` of a Conv2d, without im2col.

    The patch Gram is banded in the kernel-row offset: with ``R[y]`` the width-unfolded input row
    ``y`` (``[C_in kw, N Wo]``), the ``(i, i')`` block of ``A`` (kernel rows ``i``, ``i'``) is
    ``sum_p R[p sh + i dh] R[p sh + i' dh]^T``. So one batched product ``R[y] R[y + delta]^T``
    per row offset ``delta = 0 .. kh-1`` (``kh`` small GEMMs over ``N Wo`` columns) and strided
    sums over ``p`` give every block exactly: ``~kh / 2`` times fewer flops than ``X^T X`` on the
    ``[N S, C_in kh kw]`` patch matrix, and no patch copy (the width unfold is a ``kw``-fold copy,
    not ``kh kw``). Exact in any precision (plain sums, no cancellation).
    """
    kh, kw = m.kernel_size
    sh, sw = m.stride
    dh, dw = m.dilation
    ph, pw = m.padding
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    N, C, H, W = a.shape
    Ho = (H - dh * (kh - 1) - 1) // sh + 1
    span = dw * (kw - 1) + 1
    R = a.unfold(3, span, sw)[..., ::dw]  # [N, C, H, Wo, kw]
    Wo = R.shape[3]
    R = R.permute(2, 1, 4, 0, 3).reshape(H, C * kw, N * Wo)  # [H, (c, j), (n, x)]
    blocks = [[None] * kh for _ in range(kh)]
    last = sh * (Ho - 1) + 1
    for e in range(kh):  # kernel-row offset i' - i = e
        delta = e * dh
        Dd = torch.bmm(R[:H - delta], R[delta:].transpose(1, 2))  # [H - delta, C kw, C kw]
        for i in range(kh - e):
            s = Dd[i * dh:i * dh + last:sh].sum(0)
            blocks[i][i + e] = s
            if e:
                blocks[i + e][i] = s.T
    A = torch.stack([torch.stack(r) for r in blocks])  # [i, i', (c, j), (c', j')]
    A = A.reshape(kh, kh, C, kw, C, kw).permute(2, 0, 3, 4, 1, 5).reshape(C * kh * kw, C * kh * kw)
    return A, N * Ho * Wo


def kfac_factors(m: nn.Module, calls: list[Call]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Un-normalised KFAC-expand factors: ``(A_sum [D_in, D_in], G [D_out, D_out], rows)``.

    ``A_sum = sum_{n,s} a a^T``, ``G = sum_{k,n,s} g g^T``; the weight block is
    ``G (x) A_sum / rows_total`` where ``rows_total = sum_n S`` over the whole data set.
    Conv2d: ``A`` by ``conv_A`` (banded, no im2col); ``G`` by a batched ``g g^T`` on the native
    ``[K N, C_out, S]`` layout (measured faster than one transposed copy + matmul).
    """
    A = G = None
    rows = 0
    for c in calls:
        a = c.args[0]
        if isinstance(m, nn.Conv2d):
            A_c, n_rows = conv_A(m, a)
            G_c = 0
            for gk in c.grads:  # per factor: no [K, N, ...] stack
                gm = gk.flatten(2)  # [N, C_out, S]
                G_c = G_c + torch.bmm(gm, gm.transpose(1, 2)).sum(0)
        else:
            x = a.reshape(-1, a.shape[-1])
            A_c, G_c = x.T @ x, 0
            for gk in c.grads:
                gm = gk.reshape(-1, gk.shape[-1])
                G_c = G_c + gm.T @ gm
            n_rows = x.shape[0]
        A = A_c if A is None else A + A_c
        G = G_c if G is None else G + G_c
        rows += n_rows
    return A, G, rows
