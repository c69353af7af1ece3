"""Per-module curvature kernels from captured inputs ``a`` and output gradients ``g``.

Hand-written: the closed forms for Linear and Conv2d are a few matmuls, cheaper than a generic
per-sample-gradient library for diag and KFAC (benchmarks/fit.py), and never form per-sample
Jacobians over all weights. Measured on LeNet-5 / CPU (profile of one fit): the Conv2d KFAC
factor ``A`` via ``F.unfold`` + batched ``X X^T`` was the top hot spot (im2col copies, ``bmm`` of
``[N, D, S]``); ``conv_A`` computes it exactly from a width-only unfold and ``kh`` banded products
(~5x faster). Conv2d diag uses chunked per-sample products (``_conv_psg_sq``). Output
gradients arrive either per factor (``call.grads``, one tensor per autograd backward: ``G`` and the
diag sums are accumulated per factor without stacking ``[K, N, ...]``) or as one sample-major
``[K, N, ...]`` tensor (``chain.Chain``: one product over all ``K N`` rows, ``kn_blocks``), or
compressed after a max-pool (``Call.pooled``: ``_conv_psg_sq_pooled`` multiplies each channel's
factors only with the patches its pool selected, 4x fewer multiply-adds for 2x2 pools, and
``_pooled_G`` scatters per cache-sized chunk). Patch matrices are one copy of a strided view
(``conv_patches`` / ``conv_rows``; ``F.unfold`` was 5-10x slower on CPU for LeNet's convolutions).
Any other module with parameters (BatchNorm,
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

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from laplace_lab.laplace.capture import Call
from laplace_lab.laplace.conv_factors import conv_A_rows, conv_geometry, rows_cheaper


@contextmanager
def eval_with_hooks(model: nn.Module, hooks: Iterable[tuple[nn.Module, object]]) -> Iterator[None]:
    """``model`` in eval mode with the forward ``hooks`` (``(module, hook)`` pairs) registered; on exit
    the hooks are removed and the model's train/eval mode is restored, also when the forward raised."""
    handles = [m.register_forward_hook(hook) for m, hook in hooks]
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()


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


def _conv_view(m: nn.Conv2d, a: torch.Tensor, order: str) -> torch.Tensor:
    """Strided (no-copy) view of a Conv2d's zero-padded input ``a`` [N, C_in, H, W] with one entry
    per (sample, output position, patch element): ``order`` ``"patches"`` -> ``[N, C, kh, kw, Ho,
    Wo]``, ``"s2d"`` -> ``[N, C, kh, kw, 2, 2, Ho/2, Wo/2]`` (positions in 2x2-block order
    ``(qy, qx, a, b)``), ``"rows"`` -> ``[N, Ho, Wo, C, kh, kw]``."""
    kh, kw, sh, sw, dh, dw, ph, pw, _, _, Ho, Wo = conv_geometry(m, a)
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    a = a.contiguous()
    N, C = a.shape[:2]
    sn, sc, sy, sx = a.stride()
    kern = ((kh, kw), (sy * dh, sx * dw))
    if order == "patches":
        return a.as_strided((N, C, *kern[0], Ho, Wo), (sn, sc, *kern[1], sy * sh, sx * sw))
    if order == "s2d":
        return a.as_strided((N, C, *kern[0], 2, 2, Ho // 2, Wo // 2),
                            (sn, sc, *kern[1], sy * sh, sx * sw, 2 * sy * sh, 2 * sx * sw))
    return a.as_strided((N, Ho, Wo, C, *kern[0]), (sn, sy * sh, sx * sw, sc, *kern[1]))


def conv_patches(m: nn.Conv2d, a: torch.Tensor, s2d: bool = False) -> torch.Tensor:
    """``F.unfold(a, ...)`` of a Conv2d's input, ``[N, C_in kh kw, S]``, built as one copy of a
    strided view (``F.unfold`` was measured 5-10x slower on CPU for LeNet's convolutions).
    ``s2d``: output positions in 2x2-block order ``(qy, qx, a, b)`` (``Call.s2d``; even ``Ho, Wo``)."""
    x = _conv_view(m, a, "s2d" if s2d else "patches")
    return x.reshape(x.shape[0], x.shape[1:4].numel(), -1)


def conv_rows(m: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """Conv2d patches as rows ``[N S, C_in kh kw]`` (one copy of a strided view)."""
    x = _conv_view(m, a, "rows")
    return x.reshape(x.shape[:3].numel(), -1)


def rows_in(m: nn.Module, a: torch.Tensor) -> torch.Tensor:
    """Module input -> ``[N, S, D_in]`` expanded rows."""
    if isinstance(m, nn.Conv2d):
        return conv_patches(m, a).transpose(1, 2)  # [N, S, C_in*kh*kw]
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


CHUNK_FLOATS = 2**19  # per-chunk intermediates of the diag kernels (~2 MiB, about L2)


def _chunk(N: int, per_sample: int) -> int:
    return max(1, min(N, CHUNK_FLOATS // max(1, per_sample)))


def kn_blocks(c: Call) -> list[torch.Tensor]:
    """The output gradients of a call as tensors whose first dimension runs over (factor, sample)
    pairs: one ``[K N, *out]`` view when ``c.grad`` is a tensor (``Chain``), else the ``K``
    per-factor ``[N, *out]`` tensors (``Capture``'s autograd loop; never stacked)."""
    if c.stacked_grad is None and c.s2d is not None:  # sums over positions: their order does not matter
        return [c.s2d.flatten(0, 1)]
    if c.stacked_grad is not None:
        return [flat_kn(c.stacked_grad)]
    return c.grads


def _conv_psg_sq(m: nn.Conv2d, names: list[str], a: torch.Tensor, grads, s2d: bool = False) -> dict[str, torch.Tensor]:
    """``{name: sum_{k,n} (per-sample grad)^2}`` for a Conv2d: ``a`` [N, C_in, H, W], ``grads``
    ``K`` x [N, C_out, Ho, Wo] or one ``[K, N, C_out, Ho, Wo]`` tensor (``s2d``: ``[K, N, C_out,
    Ho Wo]`` with positions in 2x2-block order, ``Call.s2d``).

    Per-sample weight gradients ``g_n [K C_out, S] @ x_n^T [S, D_in]`` as batched matmuls over
    chunks of samples (the chunk's ``[n, K C_out, D_in]`` result stays in cache), squared and
    summed at once; never the ``[K, N, C_out, D_in]`` tensor of all of them. With a sample-major
    tensor (``Chain``'s layout) the ``[n, K C_out, S]`` operand is a view; a list is stacked per
    chunk.
    """
    tensor = isinstance(grads, torch.Tensor)
    K = grads.shape[0] if tensor else len(grads)
    N, n_out = grads[0].shape[:2]
    out = {}
    if "weight" in names:
        D = m.weight[0].numel()
        gs = grads.transpose(0, 1) if tensor else None  # [N, K, C_out, ...]
        acc = a.new_zeros(K * n_out, D)
        for i in range(0, N, _chunk(N, K * n_out * D)):  # chunk: patches, product stay in cache
            x = conv_patches(m, a[i:i + _chunk(N, K * n_out * D)], s2d)  # [n, D, S]
            n, S = x.shape[0], x.shape[2]
            if tensor:
                gg = gs[i:i + n].reshape(n, K * n_out, S)
            else:
                gg = torch.stack([gk[i:i + n].flatten(2) for gk in grads], 1).flatten(1, 2)  # [n, K n_out, S]
            acc += torch.bmm(gg, x.transpose(1, 2)).square_().sum(0)
        out["weight"] = acc.reshape(K, n_out, D).sum(0).reshape(m.weight.shape)
    if "bias" in names:
        if tensor:
            out["bias"] = grads.flatten(3).sum(3).square().sum((0, 1))
        else:
            out["bias"] = sum(gk.flatten(2).sum(2).square().sum(0) for gk in grads)
    return out


def _conv_psg_sq_pooled(m: nn.Conv2d, names: list[str], a: torch.Tensor, v: torch.Tensor,
                        idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """``_conv_psg_sq`` from compressed gradients (``Call.pooled``: ``v`` [N, K, C_out, P] at
    positions ``idx`` [N, C_out, P]): each output channel only sees the ``P`` patches its pool
    selected, so the per-sample products are ``[K, P] @ [P, D_in]`` per (sample, channel) on
    gathered patch rows: ``S / P`` (4 for 2x2 pools) times fewer flops than the dense
    ``[K C_out, S] @ [S, D_in]``, no dense gradient."""
    N, K, C, P = v.shape
    out = {}
    if "weight" in names:
        D = m.weight[0].numel()
        step = _chunk(N, C * P * D)  # chunk: rows, gathered rows, product stay in cache
        acc = a.new_zeros(C * K * D)
        vt = v.transpose(1, 2)  # [N, C, K, P]
        offset = None
        for i in range(0, N, step):
            rows = conv_rows(m, a[i:i + step])  # [n S, D]
            n = min(N, i + step) - i
            if offset is None or offset.shape[0] != n:
                offset = (torch.arange(n, device=idx.device) * (rows.shape[0] // n))[:, None, None]
            sel = (idx[i:i + n] + offset).reshape(-1)
            xg = rows.index_select(0, sel).view(n * C, P, D)
            psg = torch.bmm(vt[i:i + n].reshape(n * C, K, P), xg)  # [n C, K, D]
            acc += psg.square_().view(n, C * K * D).sum(0)
        out["weight"] = acc.view(C, K, D).sum(1).reshape(m.weight.shape)
    if "bias" in names:
        out["bias"] = v.sum(3).square().sum((0, 1))
    return out


def _pooled_G(v: torch.Tensor, idx: torch.Tensor, S: int) -> torch.Tensor:
    """``G = sum_{k,n,s} g g^T`` from compressed gradients: per chunk of samples, scattered into a
    ``[n, C, K S]`` buffer (each sample's factors side by side; cache-sized), then one
    ``[C, K S] @ [K S, C]`` product per sample. Measured faster than ``[C, S]`` products per
    (sample, factor), per-slot masked products or one ``[C, N K S]`` product (which is also less
    accurate in float32)."""
    N, K, C, P = v.shape
    vt = v.transpose(1, 2)  # [N, C, K, P]
    step = _chunk(N, C * K * S)
    G = 0
    for i in range(0, N, step):
        n = min(N, i + step) - i
        dense = v.new_zeros(n, C, K, S)
        dense.scatter_(3, idx[i:i + n, :, None].expand(n, C, K, P), vt[i:i + n])
        d = dense.view(n, C, K * S)
        G = G + torch.bmm(d, d.transpose(1, 2)).sum(0)
    return G


def diag_sq(m: nn.Module, names: list[str], calls: list[Call]) -> dict[str, torch.Tensor]:
    """``{name: sum_{k,n} (per-sample grad)^2}`` with the shape of each parameter."""
    if is_kfac_module(m) and len(calls) == 1:
        c = calls[0]
        if isinstance(m, nn.Conv2d) and c.pooled is not None and c.stacked_grad is None:
            return _conv_psg_sq_pooled(m, names, c.args[0], *c.pooled)
        if isinstance(m, nn.Conv2d) and c.s2d is not None and c.stacked_grad is None:
            return _conv_psg_sq(m, names, c.args[0], c.s2d.transpose(0, 1), s2d=True)
        if isinstance(m, nn.Conv2d):
            return _conv_psg_sq(m, names, c.args[0], c.stacked_grad if c.stacked_grad is not None else c.grads)
        a = rows_in(m, c.args[0])
        if a.shape[1] == 1:  # Linear without weight sharing: closed form
            if c.stacked_grad is not None:
                g2 = c.stacked_grad.square().sum(0).reshape(a.shape[0], -1)  # [N, D_out]
            else:
                g2 = sum(gk.reshape(gk.shape[0], -1).square() for gk in c.grads)
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

    Small images (``W^2 <= 1.5 kw^2 Wo``, e.g. LeNet) go to ``conv_factors.conv_A_rows`` (row-pair
    GEMMs, ~1.5-2x faster there); see ``conv_factors.rows_cheaper``.
    """
    if rows_cheaper(m, a):
        return conv_A_rows(m, a)
    kh, kw, sh, sw, dh, dw, ph, pw, H, _, Ho, Wo = conv_geometry(m, a)
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    N, C = a.shape[:2]
    R = a.unfold(3, dw * (kw - 1) + 1, sw)[..., ::dw]  # [N, C, H, Wo, kw]
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


def kfac_factors(m: nn.Module, calls: list[Call], approx: str,
                 inputs: bool = True) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """Un-normalised KFAC factors ``(A_sum [D_in, D_in], G [D_out, D_out], rows)`` in the
    convention ``approx`` (``options.KfacApprox``; kron's option ``kfac_approx``); the weight block is ``G (x) A_sum / rows_total``
    with ``rows_total`` summed over the whole data set.

    ``expand``: ``A_sum = sum_{n,s} a a^T``, ``G = sum_{k,n,s} g g^T``, ``rows = N S``.
    ``reduce``: ``A_sum = sum_n abar abar^T`` (``abar = mean_s a``), ``G = sum_{k,n} gsum gsum^T``
    (``gsum = sum_s g``), ``rows = N``. ``backpack``: expand's ``A_sum``, reduce's ``G``, ``rows = N``
    (Conv2d; a Linear with weight sharing raises, as BackPack does).
    Conv2d: ``A`` by ``conv_A`` (banded, no im2col); ``G`` by a batched ``g g^T`` on the native
    ``[K N, C_out, S]`` layout (measured faster than one transposed copy + matmul).
    ``inputs=False``: ``G`` only (``A`` ``None``), for a further chunk of the same batch's factors.
    """
    A = G = None
    rows = 0
    for c in calls:
        if isinstance(m, nn.Conv2d):
            A_c, G_c, n_rows = _conv_kfac(m, c, approx, inputs)
        else:
            A_c, G_c, n_rows = _linear_kfac(c, approx, inputs)
        if inputs:
            A = A_c if A is None else A + A_c
        G = G_c if G is None else G + G_c
        rows += n_rows
    return A, G, rows


def _conv_kfac(m: nn.Conv2d, c: Call, approx: str, inputs: bool = True) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """One call's ``(A_sum, G, rows)`` of a Conv2d (``kfac_factors``)."""
    a = c.args[0]
    N = a.shape[0]
    if not inputs:
        A_c, n_rows = None, 0
    elif approx == "reduce":  # per-sample patch sums over the output positions (a strided view, summed)
        Ho, Wo = conv_geometry(m, a)[-2:]
        x = _conv_view(m, a, "patches").sum((-2, -1)).reshape(N, -1) / (Ho * Wo)  # [N, C_in kh kw]
        A_c, n_rows = x.T @ x, N
    else:
        A_c, n_rows = conv_A(m, a)
        if approx == "backpack":
            n_rows = N
    direct = c.pooled is None or c.stacked_grad is not None  # else compressed after a max-pool
    if approx == "expand":
        G_c = _pooled_G(*c.pooled, c.out_shape[2:].numel()) if not direct else 0
        for gk in (kn_blocks(c) if direct else []):  # per factor or all at once: no [K, N, ...] stack
            gm = gk.flatten(2)  # [N, C_out, S]
            G_c = G_c + torch.bmm(gm, gm.transpose(1, 2)).sum(0)
        return A_c, G_c, n_rows
    # reduce / backpack: G of the per-(factor, sample) gradient sums over positions (the bias gradients)
    sums = [gk.flatten(2).sum(-1) for gk in kn_blocks(c)] if direct else [c.pooled[0].sum(-1).flatten(0, 1)]
    return A_c, sum(s.T @ s for s in sums), n_rows


def _linear_kfac(c: Call, approx: str, inputs: bool = True) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """One call's ``(A_sum, G, rows)`` of a Linear on ``[N, *, D_in]`` (``kfac_factors``)."""
    a = c.args[0]
    shared = a.dim() > 2 and a.shape[1:-1].numel() > 1
    if approx == "expand" or not shared:  # every row a sample
        x, rows = a.reshape(-1, a.shape[-1]), a.shape[:-1].numel()
        g_rows = (gk.reshape(-1, gk.shape[-1]) for gk in kn_blocks(c))
    elif approx == "backpack":
        raise ValueError(f"kfac_approx='backpack' is defined for Conv2d and for Linear layers on [N, D] inputs "
                         f"(BackPack's convention); got a Linear input of shape {tuple(a.shape)}. "
                         f"Allowed for it: 'expand', 'reduce'")
    else:  # reduce: per-sample mean of the inputs, sum of the output gradients
        x, rows = a.reshape(a.shape[0], -1, a.shape[-1]).mean(1), a.shape[0]
        g_rows = (gk.reshape(gk.shape[0], -1, gk.shape[-1]).sum(1) for gk in kn_blocks(c))
    return (x.T @ x if inputs else None), sum((g.T @ g for g in g_rows), 0), rows
